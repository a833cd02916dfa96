"""Scores against binary labels: ROC/AUC (scikit-learn), ECE, Brier, SPRINTER's η_TP and η_FP."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve


def auc(y: np.ndarray, score: np.ndarray) -> float | None:
    """Area under the ROC curve; None when only one class is present (undefined)."""
    y = np.asarray(y).astype(bool)
    if y.all() or not y.any():
        return None
    return float(roc_auc_score(y, np.asarray(score, dtype=np.float64)))


def weighted_auc(y: np.ndarray, score: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """AUC of each row of `weights` (shape (B, n), one weight per record, e.g. how often a
    bootstrap drew its prompt), ties counting one half: sum over positive i and negative j of
    w_i w_j [s_i > s_j] (+ 1/2 on ties) over W_pos W_neg. One sort serves every row, so B
    resamples cost O(B n), not B calls of roc_auc_score; NaN where a row lacks a class."""
    y = np.asarray(y).astype(bool)
    score = np.asarray(score, dtype=np.float64)
    if len(score) == 0:
        return np.full(len(weights), np.nan)
    order = np.argsort(score, kind="stable")
    sorted_score = score[order]
    starts = np.flatnonzero(np.r_[True, sorted_score[1:] != sorted_score[:-1]])
    w = np.asarray(weights, dtype=np.float64)[:, order]
    positive = np.add.reduceat(w * y[order], starts, axis=1)  # (B, tie levels)
    negative = np.add.reduceat(w * ~y[order], starts, axis=1)
    below = np.cumsum(negative, axis=1) - negative  # negatives strictly below each level
    wins = (positive * (below + 0.5 * negative)).sum(axis=1)
    pairs = positive.sum(axis=1) * negative.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(pairs > 0, wins / pairs, np.nan)


def roc(y: np.ndarray, score: np.ndarray, max_points: int = 400) -> dict[str, list[float]]:
    """False- and true-positive rates (thinned to at most max_points for plots and JSON)."""
    y = np.asarray(y).astype(bool)
    if y.all() or not y.any():
        return {"fpr": [], "tpr": []}
    fpr, tpr, _ = roc_curve(y, np.asarray(score, dtype=np.float64))
    if len(fpr) > max_points:
        keep = np.unique(np.linspace(0, len(fpr) - 1, max_points).round().astype(int))
        fpr, tpr = fpr[keep], tpr[keep]
    return {"fpr": fpr.tolist(), "tpr": tpr.tolist()}


def reliability(y: np.ndarray, prob: np.ndarray, n_bins: int = 10) -> dict[str, list]:
    """Per equal-width probability bin [k/n, (k+1)/n) (the last closed at 1): count, mean
    predicted probability, observed rate."""
    y = np.asarray(y, dtype=np.float64)
    prob = np.clip(np.asarray(prob, dtype=np.float64), 0.0, 1.0)
    which = np.clip(np.floor(prob * n_bins).astype(np.int64), 0, n_bins - 1)
    count = np.bincount(which, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_prob = np.bincount(which, weights=prob, minlength=n_bins) / count
        rate = np.bincount(which, weights=y, minlength=n_bins) / count
    return {
        "count": count.tolist(),
        "mean_prob": [None if c == 0 else float(v) for c, v in zip(count, mean_prob, strict=True)],
        "rate": [None if c == 0 else float(v) for c, v in zip(count, rate, strict=True)],
    }


def ece(y: np.ndarray, prob: np.ndarray, n_bins: int = 10) -> float:
    """Expected calibration error: sum_b (n_b / n) |observed rate_b - mean probability_b|,
    over equal-width bins of the predicted probability (the last bin closed at 1)."""
    table = reliability(y, prob, n_bins)
    n = max(sum(table["count"]), 1)
    return float(
        sum(
            c / n * abs(r - m)
            for c, r, m in zip(table["count"], table["rate"], table["mean_prob"], strict=True)
            if c
        )
    )


def brier(y: np.ndarray, prob: np.ndarray) -> float:
    """Mean squared error of the probability against the 0/1 outcome."""
    y = np.asarray(y, dtype=np.float64)
    return float(np.mean((np.clip(np.asarray(prob, dtype=np.float64), 0, 1) - y) ** 2))


def eta_rates(y: np.ndarray, score: np.ndarray, tau: float) -> dict[str, float | None]:
    """SPRINTER §3.1: η_TP = P(V >= τ | acceptable), η_FP = P(V >= τ | unacceptable)."""
    y = np.asarray(y).astype(bool)
    accept = np.asarray(score) >= tau
    return {
        "eta_TP": float(accept[y].mean()) if y.any() else None,
        "eta_FP": float(accept[~y].mean()) if (~y).any() else None,
    }
