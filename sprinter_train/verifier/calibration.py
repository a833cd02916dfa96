"""Temperature scaling (Guo et al. 2017): one scalar T on the logit, fitted on the val split.

sigmoid(z / T) keeps the ranking (AUC) and SPRINTER's tau = 0.5 decisions (sigmoid(z/T) >= 0.5
iff z >= 0) while fixing over- or under-confidence, which matters once probabilities are
multiplied along a draft run to plan its length. The mean BCE of sigmoid(a z) against y is
convex in a = 1/T, so it is unimodal in log T: a golden-section search on log T finds the
minimum with no optimiser state and no seed, the same T on every run and machine.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

T_MIN, T_MAX = 1e-2, 1e2  # the search interval; a T at either end says the logits carry ~no signal
TOLERANCE = 1e-7  # on log T
GOLDEN = (math.sqrt(5) - 1) / 2


def nll(logits: np.ndarray, targets: np.ndarray, temperature: float = 1.0) -> float:
    """Mean BCE of sigmoid(logits / T) against targets in [0, 1] (hard or soft), in float64,
    computed stably as max(z, 0) - z y + log(1 + exp(-|z|))."""
    z = np.asarray(logits, dtype=np.float64) / float(temperature)
    y = np.asarray(targets, dtype=np.float64)
    return float(np.mean(np.maximum(z, 0.0) - z * y + np.log1p(np.exp(-np.abs(z)))))


def fit_temperature(
    logits: np.ndarray, targets: np.ndarray, fitted_on: str = "val"
) -> dict[str, Any]:
    """The T in [T_MIN, T_MAX] that minimises `nll` on these rows, as the sidecar stores it.

    T = 1 is kept unless another T lowers the NLL, so nll_after <= nll_before always holds.
    """
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(targets, dtype=np.float64)
    if z.shape != y.shape or z.ndim != 1 or len(z) == 0:
        raise ValueError(
            f"temperature fit needs matching non-empty 1-D rows, got {z.shape}, {y.shape}"
        )

    def loss(log_t: float) -> float:
        return nll(z, y, math.exp(log_t))

    low, high = math.log(T_MIN), math.log(T_MAX)
    a, b = high - GOLDEN * (high - low), low + GOLDEN * (high - low)
    fa, fb = loss(a), loss(b)
    while high - low > TOLERANCE:
        if fa <= fb:  # the minimum lies in [low, b]
            high, b, fb = b, a, fa
            a = high - GOLDEN * (high - low)
            fa = loss(a)
        else:  # in [a, high]
            low, a, fa = a, b, fb
            b = low + GOLDEN * (high - low)
            fb = loss(b)
    log_t = (low + high) / 2
    before, after = loss(0.0), loss(log_t)
    if after >= before:
        log_t, after = 0.0, before
    fit = {
        "method": "temperature",
        "temperature": math.exp(log_t),
        "fitted_on": fitted_on,
        "rows": int(len(z)),
        "nll_before": before,
        "nll_after": after,
    }
    warning = bound_warning(log_t, fitted_on)
    if warning is not None:
        log.warning("temperature fit: %s", warning)
        fit["warning"] = warning
    return fit


def bound_warning(log_t: float, fitted_on: str) -> str | None:
    """Why a T at an end of [T_MIN, T_MAX] is no calibration (None inside): the optimum lies
    beyond the search, at T_MAX because the logits carry almost no signal of the label on
    these rows, at T_MIN because they separate it perfectly. The sidecar keeps the line."""
    margin = 1e3 * TOLERANCE  # the search stops within TOLERANCE of an end
    if log_t >= math.log(T_MAX) - margin:
        return (
            f"T stopped at its upper bound {T_MAX:g}: the logits carry almost no signal of "
            f"the label on the {fitted_on} split (calibrated scores near 0.5); the verifier "
            f"does not rank that split's labels, check the records it was fitted on"
        )
    if log_t <= math.log(T_MIN) + margin:
        return (
            f"T stopped at its lower bound {T_MIN:g}: the logits separate the label on the "
            f"{fitted_on} split (almost) perfectly, so every sharper T lowers its NLL "
            "(calibrated scores near 0 or 1)"
        )
    return None
