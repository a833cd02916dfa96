"""Discrete entropies and information gain in bits (SV §4.1, §7.4: I(X; Y) = H(X) - H(X | Y)).

How much SV's (S, A) cells tell about acceptance: the table's fit reports it on the records
it is fitted on, the evaluation on held-out ones. Plain numpy on integer codes, so both (sv
below evaluation in the layer order) read the same estimator.

Plug-in estimates from counts, as SV reports them, plus the Miller-Madow correction: the
plug-in I is biased upwards by about (cells used - 1) / (2 N ln 2) bits, so with many bins
and few samples a positive plug-in I alone proves nothing.
"""

from __future__ import annotations

import numpy as np

LN2 = float(np.log(2.0))


def entropy_bits(counts: np.ndarray) -> float:
    """H of the empirical distribution given by counts; 0 log 0 = 0."""
    counts = np.asarray(counts, dtype=np.float64).ravel()
    counts = counts[counts > 0]
    if counts.size == 0:
        return 0.0
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def discretise(x: np.ndarray, n_bins: int, lo: float = 0.0, hi: float = 1.0) -> np.ndarray:
    """Equal-width bin index of each value in [lo, hi]; the last bin is closed at hi."""
    scaled = (np.asarray(x, dtype=np.float64) - lo) / (hi - lo) * n_bins
    return np.clip(np.floor(scaled).astype(np.int64), 0, n_bins - 1)


def information(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """H(X), H(X | Y), I(X; Y) in bits for integer codes x, y (plug-in and Miller-Madow)."""
    x = np.asarray(x, dtype=np.int64)
    y = np.asarray(y, dtype=np.int64)
    n = len(x)
    if n == 0:
        return {"H_X": 0.0, "H_X_given_Y": 0.0, "I": 0.0, "I_miller_madow": 0.0, "n": 0}
    _, x_codes = np.unique(x, return_inverse=True)
    _, y_codes = np.unique(y, return_inverse=True)
    nx = int(x_codes.max()) + 1
    joint = np.bincount(y_codes * nx + x_codes, minlength=(int(y_codes.max()) + 1) * nx)
    joint = joint.reshape(-1, nx)
    h_x = entropy_bits(joint.sum(0))
    n_y = joint.sum(1)
    h_x_given_y = float(sum(c / n * entropy_bits(row) for c, row in zip(n_y, joint, strict=True)))
    # Miller-Madow: each entropy gains (nonzero cells - 1) / (2 n ln 2)
    used_x = int((joint.sum(0) > 0).sum())
    used_xy = (joint > 0).sum(1)
    correction = ((used_x - 1) - float(np.sum(np.maximum(used_xy - 1, 0)))) / (2 * n * LN2)
    i = h_x - h_x_given_y
    return {
        "H_X": h_x,
        "H_X_given_Y": h_x_given_y,
        "I": i,
        "I_miller_madow": i + correction,
        "n": n,
    }


def heldout_information(
    x_fit: np.ndarray,
    y_fit: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    n_x: int,
    alpha: float = 0.5,
) -> dict[str, float]:
    """Information gain that generalises: cross-entropies in bits of held-out X under the
    fitted marginal P(X) (add-alpha) and the fitted P(X | Y), each cell shrunk towards the
    marginal with alpha * n_x pseudo-counts (an unseen cell predicts the marginal), and their
    difference. Unlike the plug-in I it is negative when the cells are too many for the data."""
    x_fit, x_test = np.asarray(x_fit, np.int64), np.asarray(x_test, np.int64)
    y_fit, y_test = np.asarray(y_fit, np.int64), np.asarray(y_test, np.int64)
    if len(x_test) == 0:
        return {"H_X_cross": 0.0, "H_X_given_Y_cross": 0.0, "I_heldout": 0.0, "n": 0}
    marginal = (np.bincount(x_fit, minlength=n_x) + alpha) / (len(x_fit) + alpha * n_x)
    n_y = int(max(y_fit.max(initial=0), y_test.max(initial=0))) + 1
    joint = np.bincount(y_fit * n_x + x_fit, minlength=n_y * n_x).reshape(n_y, n_x)
    prior = alpha * n_x
    conditional = (joint + prior * marginal) / (joint.sum(1, keepdims=True) + prior)
    h_x = float(-np.log2(marginal[x_test]).mean())
    h_x_y = float(-np.log2(conditional[y_test, x_test]).mean())
    return {
        "H_X_cross": h_x,
        "H_X_given_Y_cross": h_x_y,
        "I_heldout": h_x - h_x_y,
        "n": len(x_test),
    }
