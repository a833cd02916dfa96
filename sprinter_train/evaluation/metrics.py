"""Each predictor's scores against both acceptance labels: AUC, calibration, η rates, curves.

The labels are SPRINTER's q/p <= 1 and speculative sampling's sampled accept event; every
metric is reported against each, so a predictor is judged on the event it stands for too.
Every AUC comes with its prompt-bootstrap interval, and each verifier's AUC minus the draft's
own q(x)'s with a paired one (the same resamples), which says whether training beat q(x).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from omegaconf import DictConfig

from sprinter_train.core.classification import auc, brier, ece, eta_rates, reliability, roc
from sprinter_train.evaluation.bootstrap import PromptBootstrap

BASELINE = "draft_q"  # the predictor every verifier's AUC is compared with, paired


def score_metrics(
    scores: dict[str, np.ndarray],
    y_label: np.ndarray,
    y_event: np.ndarray,
    ecfg: DictConfig,
    bootstrap: PromptBootstrap,
) -> dict[str, Any]:
    """Per metric, per predictor: AUC and its interval, ECE and Brier, η_TP/η_FP at each τ,
    ROC, reliability; per verifier, its AUC minus q(x)'s with the paired interval."""
    bins = int(ecfg.ece_bins)
    out: dict[str, Any] = {
        "auc": {},
        "auc_ci": {},
        "auc_sampled": {},
        "auc_sampled_ci": {},
        "auc_minus_draft_q": {},
        "calibration": {},
        "eta": {},
        "roc": {},
        "roc_sampled": {},
        "reliability": {},
    }
    resampled = {name: bootstrap.aucs(y_label, s) for name, s in scores.items()}
    for name, s in scores.items():
        out["auc"][name] = auc(y_label, s)
        out["auc_ci"][name] = bootstrap.interval(resampled[name])
        out["auc_sampled"][name] = auc(y_event, s)
        out["auc_sampled_ci"][name] = bootstrap.auc_interval(y_event, s)
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
    base = out["auc"].get(BASELINE)
    for name, value in out["auc"].items():
        if name.startswith("verifier_") and value is not None and base is not None:
            out["auc_minus_draft_q"][name] = {
                "value": value - base,
                "ci": bootstrap.interval(resampled[name] - resampled[BASELINE]),
            }
    return out
