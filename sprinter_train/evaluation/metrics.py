"""Each predictor's scores against both acceptance labels: AUC, calibration, η rates, curves.

The labels are SPRINTER's q/p <= 1 and speculative sampling's sampled accept event; every
metric is reported against each, so a predictor is judged on the event it stands for too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from omegaconf import DictConfig

from sprinter_train.core.classification import auc, brier, ece, eta_rates, reliability, roc


def score_metrics(
    scores: dict[str, np.ndarray], y_label: np.ndarray, y_event: np.ndarray, ecfg: DictConfig
) -> dict[str, Any]:
    """Per metric, per predictor: AUC, ECE and Brier, η_TP/η_FP at each τ, ROC, reliability."""
    bins = int(ecfg.ece_bins)
    out: dict[str, Any] = {
        "auc": {},
        "auc_sampled": {},
        "calibration": {},
        "eta": {},
        "roc": {},
        "roc_sampled": {},
        "reliability": {},
    }
    for name, s in scores.items():
        out["auc"][name] = auc(y_label, s)
        out["auc_sampled"][name] = auc(y_event, s)
        out["calibration"][name] = {
            "ece_q_le_p": ece(y_label, s, bins),
            "brier_q_le_p": brier(y_label, s),
            "ece_sampled": ece(y_event, s, bins),
            "brier_sampled": brier(y_event, s),
        }
        out["eta"][name] = {f"{tau:g}": eta_rates(y_label, s, float(tau)) for tau in ecfg.taus}
        out["roc"][name] = roc(y_label, s)
        out["roc_sampled"][name] = roc(y_event, s)
        out["reliability"][name] = {
            "q_le_p": reliability(y_label, s, bins),
            "sampled": reliability(y_event, s, bins),
        }
    return out
