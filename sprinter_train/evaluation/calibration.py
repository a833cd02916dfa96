"""Whether a verifier's probabilities can be planned with: ECE and Brier before and after the
temperature in its sidecar (calibrated = sigmoid(logit / T); T = 1 when the sidecar has none).

Each verifier is judged against two targets. Its own, the one its temperature was fitted to:
q/p <= λ for a ratio verifier, and min(1, p/q), the expected acceptance, for the soft-label
one (a reliability bin's observed rate is then the bin's mean min(1, p/q), and Brier is the
squared error to that expectation). And the sampled accept event u < min(1, p/q), the event a
goodput plan spends: a λ > 1 verifier calibrated for q/p <= λ still overstates acceptance.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from sprinter_train.core.classification import brier, ece, reliability
from sprinter_train.verifier.checkpoint import VerifierCheckpoint
from sprinter_train.verifier.labels import Label


def probabilities(logits: np.ndarray) -> np.ndarray:
    """sigmoid(logit) in the logits' dtype: the very numbers VerifierCheckpoint.score gives."""
    return torch.sigmoid(torch.from_numpy(np.asarray(logits))).numpy()


def own_target(checkpoint: VerifierCheckpoint, frame: pd.DataFrame) -> tuple[str, np.ndarray]:
    """What the verifier's probability estimates, per row: its name and its values (the
    training targets: 0/1 at λ, or min(1, p/q))."""
    label = Label(checkpoint.label, checkpoint.lam)
    return label.describe(), label.targets(frame[label.column].to_numpy())


def before_after(
    y: np.ndarray, before: np.ndarray, after: np.ndarray, bins: int
) -> dict[str, float]:
    return {
        "ece_before": ece(y, before, bins),
        "ece_after": ece(y, after, bins),
        "brier_before": brier(y, before),
        "brier_after": brier(y, after),
    }


def calibration_report(
    verifiers: dict[str, VerifierCheckpoint],
    logits: dict[str, np.ndarray],
    frame: pd.DataFrame,
    y_event: np.ndarray,
    bins: int,
) -> dict[str, Any]:
    """Per verifier: label kind, temperature, target, ECE and Brier before and after the
    temperature against its own target and the sampled event, and the reliability tables."""
    out: dict[str, Any] = {}
    for name, checkpoint in verifiers.items():
        before = probabilities(logits[name])
        after = np.asarray(checkpoint.calibrated(logits[name]))
        target, y = own_target(checkpoint, frame)
        out[name] = {
            "label": checkpoint.label,
            "temperature": checkpoint.temperature,
            "fitted_on": (checkpoint.meta.get("calibration") or {}).get("fitted_on"),
            "warning": (checkpoint.meta.get("calibration") or {}).get("warning"),  # T at a bound
            "target": target,
            "own_target": before_after(y, before, after, bins),
            "sampled": before_after(y_event, before, after, bins),
            "reliability": {
                key: {"before": reliability(t, before, bins), "after": reliability(t, after, bins)}
                for key, t in (("own_target", y), ("sampled", y_event))
            },
        }
    return out
