"""How much of SPRINTER's label the draft's own features can predict, linear or not.

When the verifier's AUC is short of SPRINTER's 0.8-0.9, this tells three reasons apart on
the same records: the training (an L2 logistic regression tuned on val, on the verifier's
own input), the inputs (adding q(x), H(q) and the draft's embedding of x, the other features
SPRINTER §3.2 suggests) and the linear form (an MLP on all of them). Every model is fitted on
the train split at the training label q/p <= λ, its regularisation chosen by val AUC, and
scored on test against q/p <= 1, the label of the report's AUC.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

from sprinter_train.core.classification import auc

SPLITS = ("train", "val", "test")
# (test labels, test scores) -> the AUC's interval over the test rows (bootstrap.py)
Interval = Callable[[np.ndarray, np.ndarray], list[float] | None]


def test_auc(y: np.ndarray, score: np.ndarray, interval: Interval | None) -> dict[str, Any]:
    """The test AUC, and its interval when the caller knows the test rows' prompts."""
    out: dict[str, Any] = {"test_auc": auc(y, score)}
    if interval is not None:
        out["test_auc_ci"] = interval(y, score)
    return out


def fit_best(
    make: Callable[[float], Any],
    grid: Sequence[float],
    x: np.ndarray,
    y_train: np.ndarray,
    y_eval: np.ndarray,
    split: np.ndarray,
    interval: Interval | None = None,
) -> dict[str, Any]:
    """One model per grid value fitted on train (standardised inputs); the best val AUC wins
    and its test AUC (with `interval`'s, if given) is reported."""
    scaler = StandardScaler().fit(x[split == "train"])
    z = {s: scaler.transform(x[split == s]) for s in SPLITS}
    best: dict[str, Any] = {}
    for value in grid:
        start = time.perf_counter()
        model = make(value).fit(z["train"], y_train[split == "train"])
        score = {s: model.predict_proba(z[s])[:, 1] for s in ("val", "test")}
        val = auc(y_eval[split == "val"], score["val"])
        if not best or (val or 0.0) > (best["val_auc"] or 0.0):
            best = {
                "setting": float(value),
                "val_auc": val,
                **test_auc(y_eval[split == "test"], score["test"], interval),
                "seconds": time.perf_counter() - start,
            }
    return best


def ceiling(
    hidden: np.ndarray,
    q: np.ndarray,
    draft_entropy: np.ndarray,
    ratio: np.ndarray,
    split: np.ndarray,
    lam: float,
    embedding: np.ndarray | None = None,
    c_grid: Sequence[float] = (1e-3, 1e-2, 1e-1),
    mlp_hidden: int = 256,
    mlp_alphas: Sequence[float] = (1e-3, 1e-1),
    seed: int = 0,
    interval: Interval | None = None,
) -> dict[str, dict[str, Any]]:
    """Test AUC against q/p <= 1 of: q(x) alone, linear probes on growing feature sets, and an
    MLP on the largest set (see the module docstring); `interval` adds each one's interval."""
    y_train, y_eval = ratio <= lam, ratio <= 1.0
    scalars = np.stack([q, draft_entropy], axis=1).astype(np.float32)
    hidden = np.asarray(hidden, dtype=np.float32)
    sets = {"hidden": hidden, "hidden + q + H(q)": np.hstack([hidden, scalars])}
    if embedding is not None:
        sets["hidden + q + H(q) + embedding of x"] = np.hstack(
            [hidden, scalars, np.asarray(embedding, dtype=np.float32)]
        )

    def logistic(c: float) -> LogisticRegression:
        return LogisticRegression(C=c, max_iter=3000)

    def mlp(alpha: float) -> MLPClassifier:
        return MLPClassifier(
            (mlp_hidden,), alpha=alpha, early_stopping=True, max_iter=200, random_state=seed
        )

    test = split == "test"
    out: dict[str, dict[str, Any]] = {"draft_q alone": test_auc(y_eval[test], q[test], interval)}
    for name, x in sets.items():
        out[f"linear: {name}"] = fit_best(logistic, c_grid, x, y_train, y_eval, split, interval)
    largest = list(sets)[-1]
    out[f"MLP ({mlp_hidden}): {largest}"] = fit_best(
        mlp, mlp_alphas, sets[largest], y_train, y_eval, split, interval
    )
    return out
