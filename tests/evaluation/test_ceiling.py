"""evaluate.ceiling tells training, inputs and the linear form apart: planted cases of each."""

from __future__ import annotations

import numpy as np

from sprinter_train.evaluation.ceiling import ceiling


def planted(n: int = 3000, d: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(n, d)).astype(np.float32)
    q = rng.random(n)
    entropy = rng.random(n)
    split = rng.choice(np.array(["train", "val", "test"]), n, p=[0.6, 0.2, 0.2])
    return hidden, q, entropy, split


def ratio_from(acceptable: np.ndarray) -> np.ndarray:
    """q/p of 0.5 where acceptable, +inf (p = 0) where not."""
    return np.where(acceptable, 0.5, np.inf)


def test_a_label_in_q_is_found_by_the_probe_that_sees_q_only() -> None:
    hidden, q, entropy, split = planted()
    out = ceiling(hidden, q, entropy, ratio_from(q > 0.5), split, 1.2, mlp_alphas=[1e-3])
    assert out["draft_q alone"]["test_auc"] == 1.0
    assert abs(out["linear: hidden"]["test_auc"] - 0.5) < 0.08  # hidden carries nothing
    assert out["linear: hidden + q + H(q)"]["test_auc"] > 0.97


def test_a_nonlinear_label_needs_the_mlp() -> None:
    hidden, q, entropy, split = planted(n=4000)
    embedding = np.random.default_rng(1).normal(size=(len(q), 3))
    xor = hidden[:, 0] * hidden[:, 1] > 0
    out = ceiling(
        hidden, q, entropy, ratio_from(xor), split, 1.2, embedding=embedding, mlp_hidden=32
    )
    linear = out["linear: hidden + q + H(q) + embedding of x"]["test_auc"]
    mlp = out["MLP (32): hidden + q + H(q) + embedding of x"]
    assert linear < 0.6 < 0.9 < mlp["test_auc"]
    assert mlp["setting"] in (1e-3, 1e-1) and mlp["val_auc"] > 0.9
