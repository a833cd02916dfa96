"""How a verifier's AUC grows with its training records (train.learning_curve in the sidecar).

The slope per doubling of records is what tells a reader whether a short AUC is a data
problem (still rising) or a feature problem (flat), and how far more harvesting would go.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def usable(points: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The points that have an AUC under `key` and a train size, smallest size first."""
    kept = [p for p in points if p.get(key) is not None and p.get("train_rows")]
    return sorted(kept, key=lambda p: p["train_rows"])


def auc_per_doubling(points: list[dict[str, Any]], key: str = "test_auc_q_le_p") -> float | None:
    """Least-squares slope of AUC against log2(train rows); None with < 2 usable points."""
    pairs = [(math.log2(p["train_rows"]), p[key]) for p in usable(points, key)]
    if len(pairs) < 2 or len({x for x, _ in pairs}) < 2:
        return None
    x, y = np.array(pairs).T
    return float(np.polyfit(x, y, 1)[0])


def last_doubling_gain(points: list[dict[str, Any]], key: str) -> float | None:
    """AUC gained per doubling between the two largest training sets: the local slope, which
    is what the next doublings are likely to bring once the curve bends (None with < 2)."""
    kept = usable(points, key)
    if len(kept) < 2 or kept[-1]["train_rows"] == kept[-2]["train_rows"]:
        return None
    before, after = kept[-2], kept[-1]
    return float((after[key] - before[key]) / math.log2(after["train_rows"] / before["train_rows"]))


def doublings_to_reach(
    points: list[dict[str, Any]], target: float, key: str, min_slope: float = 1e-3
) -> float | None:
    """Doublings of the largest training set that the last doubling's gain needs to reach
    `target` (0 if reached; None when that gain is below `min_slope`, where more records
    would not get there)."""
    kept = usable(points, key)
    if not kept:
        return None
    last = kept[-1]
    if last[key] >= target:
        return 0.0
    slope = last_doubling_gain(points, key)
    if slope is None or slope < min_slope:
        return None
    return float((target - last[key]) / slope)


def summarise(curves: dict[str, list[dict[str, Any]]], target: float) -> dict[str, Any]:
    """Per verifier: its points, the fitted slope per doubling (val and test), the last
    doubling's gain and the doublings that gain says `target` needs."""
    out: dict[str, Any] = {}
    for name, points in curves.items():
        if not points:
            continue
        out[name] = {
            "points": points,
            "test_auc_per_doubling": auc_per_doubling(points, "test_auc_q_le_p"),
            "val_auc_per_doubling": auc_per_doubling(points, "val_auc_q_le_p"),
            "test_auc_last_doubling": last_doubling_gain(points, "test_auc_q_le_p"),
            "target_auc": target,
            "doublings_to_target_test": doublings_to_reach(points, target, "test_auc_q_le_p"),
        }
    return out
