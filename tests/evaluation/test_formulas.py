"""Formulas against brute force or Monte Carlo: alpha, implied speedup, sampling warps."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from sprinter_train.core.distributions import acceptance_alpha, entropy, implied_speedup
from sprinter_train.core.sampling import SamplingConfig, warp_probs


def test_alpha_is_the_sd_acceptance_probability_by_monte_carlo() -> None:
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    n = 200_000
    x = rng.choice(6, size=n, p=q)
    accepted = rng.random(n) < np.minimum(1.0, p[x] / q[x])
    alpha = float(acceptance_alpha(torch.tensor(p), torch.tensor(q)))
    se = np.sqrt(alpha * (1 - alpha) / n)
    assert abs(accepted.mean() - alpha) < 3 * se


@pytest.mark.parametrize(("alpha", "gamma"), [(0.3, 1), (0.6, 3), (0.8, 5)])
def test_implied_speedup_matches_simulated_sd_rounds(alpha: float, gamma: int) -> None:
    rng = np.random.default_rng(1)
    rounds = 100_000
    accepts = rng.random((rounds, gamma)) < alpha
    # tokens per round: accepted prefix + one token from the target (correction or bonus)
    prefix = np.where(accepts.all(1), gamma, accepts.argmin(1))
    tokens = prefix + 1
    c, v = 0.1, 1.3
    simulated = tokens.mean() / (gamma * c + v)
    se = tokens.std() / np.sqrt(rounds) / (gamma * c + v)
    assert abs(implied_speedup(alpha, gamma, c, v) - simulated) < 3 * se


def test_entropy_matches_definition() -> None:
    p = torch.tensor([0.5, 0.25, 0.25, 0.0])
    assert float(entropy(p)) == pytest.approx(1.5 * np.log(2))


def brute_force_warp(logits: np.ndarray, t: float, k: int, top_p: float) -> np.ndarray:
    z = logits / t
    order = np.argsort(-z, kind="stable")
    keep = np.zeros_like(z, dtype=bool)
    keep[order[:k] if k else order] = True
    probs = np.exp(z - z.max()) * keep
    probs /= probs.sum()
    mass, nucleus = 0.0, np.zeros_like(keep)
    for i in order:
        if not keep[i] or mass >= top_p:
            continue
        nucleus[i] = True
        mass += probs[i]
    out = probs * nucleus
    return out / out.sum()


@pytest.mark.parametrize(
    ("t", "k", "top_p"), list(itertools.product([0.5, 1.0, 1.7], [0, 3], [1.0, 0.8, 0.3]))
)
def test_warp_matches_brute_force(t: float, k: int, top_p: float) -> None:
    logits = np.random.default_rng(2).normal(size=9) * 2
    got = warp_probs(torch.tensor(logits), SamplingConfig(t, k, top_p)).numpy()
    np.testing.assert_allclose(got, brute_force_warp(logits, t, k, top_p), atol=1e-6)


def test_warp_keeps_zero_probability_tokens_at_zero() -> None:
    logits = torch.tensor([1.0, float("-inf"), 0.5, float("-inf")])
    probs = warp_probs(logits, SamplingConfig(0.7, 0, 0.95))
    assert probs[1] == 0 and probs[3] == 0 and float(probs.sum()) == pytest.approx(1.0)


def test_greedy_is_one_hot_on_the_argmax() -> None:
    probs = warp_probs(torch.tensor([0.1, 2.0, -1.0]), SamplingConfig(temperature=0))
    assert probs.tolist() == [0.0, 1.0, 0.0]
