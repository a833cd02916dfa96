"""The acceptance and stopping rules against exact sums and Monte-Carlo simulation."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from scipy.stats import chisquare

from sprinter_train.core.config import compose_config
from sprinter_train.core.rules import (
    adaedl_should_stop,
    heuristic_next_gamma,
    mtad_accept_length,
    residual_distribution,
    speculative_accept_length,
    speculative_step,
    sprinter_verify_last,
    sv_expected_accepted,
    sv_goodput,
    sv_prob_accept_count,
    svip_should_stop,
)
from sprinter_train.core.sampling import SamplingConfig, sample, warp_probs
from sprinter_train.decoding.engine import DraftStep
from sprinter_train.decoding.state import SequenceState
from sprinter_train.evaluation.predictors import adaedl_bound, svip_score


def random_dist(rng: np.random.Generator, n: int, zeros: int = 0) -> torch.Tensor:
    w = rng.gamma(0.7, size=n)
    w[rng.choice(n, zeros, replace=False)] = 0
    return torch.tensor(w / w.sum(), dtype=torch.float64)


def test_residual_is_normalised_positive_part() -> None:
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.5, 0.1, 0.2])
    torch.testing.assert_close(residual_distribution(p, q), torch.tensor([0.75, 0.0, 0.25, 0.0]))
    assert torch.equal(residual_distribution(p, p), p)  # nothing to correct: fall back to p


def test_accept_length_stops_at_first_failed_ratio() -> None:
    p = torch.tensor([[0.5, 0.5], [0.1, 0.9], [0.5, 0.5]])
    q = torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.5, 0.5]])
    drafts = [0, 0]  # ratios p/q: 1.0 and 0.111
    assert speculative_accept_length(p, q, drafts, torch.tensor([0.99, 0.05])) == 2
    assert speculative_accept_length(p, q, drafts, torch.tensor([0.99, 0.2])) == 1
    assert speculative_accept_length(p, q, [], torch.tensor([])) == 0


def test_speculative_step_emits_the_target_distribution() -> None:
    """x ~ q then the rule: the first emitted token is distributed as p (Leviathan Thm. 1)."""
    rng = np.random.default_rng(0)
    p, q = random_dist(rng, 6, zeros=1), random_dist(rng, 6, zeros=2)
    gen = torch.Generator().manual_seed(1)
    counts = np.zeros(6)
    for _ in range(20000):
        x = sample(q, gen)
        n, token = speculative_step(torch.stack([p, p]), q[None], [x], gen)
        counts[x if n else token] += 1
    assert counts[p.numpy() == 0].sum() == 0
    support = p.numpy() > 0
    assert chisquare(counts[support], 20000 * p.numpy()[support]).pvalue > 1e-3


def test_sprinter_verify_last_is_speculative_sampling_of_one_token() -> None:
    rng = np.random.default_rng(3)
    p, q = random_dist(rng, 5), random_dist(rng, 5)
    gen = torch.Generator().manual_seed(4)
    counts = np.bincount(
        [sprinter_verify_last(p, q, sample(q, gen), gen) for _ in range(20000)], minlength=5
    )
    assert chisquare(counts, 20000 * p.numpy()).pvalue > 1e-3


def test_sample_follows_probabilities_and_skips_zeros() -> None:
    probs = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3, 0.0])
    gen = torch.Generator().manual_seed(0)
    counts = np.bincount([sample(probs, gen) for _ in range(20000)], minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    assert chisquare(counts[[1, 3, 4]], 20000 * np.array([0.1, 0.6, 0.3])).pvalue > 1e-3


def test_nucleus_beyond_the_first_topk_matches_sorting() -> None:
    """A flat 1000-token distribution needs a nucleus far wider than the first top-k guess."""
    logits = torch.randn(2, 1000, generator=torch.Generator().manual_seed(0)) * 0.1
    got = warp_probs(logits, SamplingConfig(1.0, 0, 0.9))
    probs = logits.softmax(-1)
    values, order = probs.sort(-1, descending=True)
    keep = (values.cumsum(-1) - values) < 0.9
    ref = torch.zeros_like(probs).scatter(-1, order, values * keep)
    torch.testing.assert_close(got, ref / ref.sum(-1, keepdim=True))
    assert 500 < int((got[0] > 0).sum()) < 1000


def test_mtad_takes_the_longest_passing_prefix() -> None:
    p_rows = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5], [0.5, 0.5]])
    drafts = [0, 0, 1]
    # p joint: 0.9, 0.18, 0.09 ; q joint below: ratios 1.0, 0.36, 0.9
    q_joint = [0.8, 0.5, 0.1]
    assert mtad_accept_length(p_rows, q_joint, drafts, tau=0.5) == 3  # not contiguous: longest
    assert mtad_accept_length(p_rows, q_joint, drafts, tau=0.95) == 1
    assert mtad_accept_length(p_rows, q_joint, drafts, tau=1.0) == 0  # tau -> 1: target only


@pytest.mark.parametrize("gamma", [0, 1, 3, 5])
def test_sv_expected_length_matches_enumeration(gamma: int) -> None:
    P = [0.9, 0.6, 0.75, 0.3, 0.5][:gamma] + [0.0] * 0
    probs = sv_prob_accept_count(P, gamma)
    assert sum(probs) == pytest.approx(1.0)
    brute = 0.0  # enumerate accept/reject outcomes of all gamma tokens
    for outcome in itertools.product([0, 1], repeat=gamma):
        weight = math.prod(P[i] if o else 1 - P[i] for i, o in enumerate(outcome))
        n = next((i for i, o in enumerate(outcome) if not o), gamma)
        brute += weight * n
    assert sv_expected_accepted(P, gamma) == pytest.approx(brute)
    assert sv_goodput(P, gamma, 0.5) == pytest.approx((brute + 1) / 0.5)


def test_stopping_rules_at_their_thresholds() -> None:
    h = 0.3  # sqrt(0.15 H) > 0.3  <=>  H > 0.6
    assert not svip_should_stop(0.59, h, 0.15) and svip_should_stop(0.61, h, 0.15)
    # 1 - sqrt(0.5 H) < 0.4  <=>  H > 0.72
    assert not adaedl_should_stop(0.71, 0.5, 0.4) and adaedl_should_stop(0.73, 0.5, 0.4)


@dataclass
class EntropyStep(DraftStep):
    """A drafted token whose draft entropy is set, not computed from logits."""

    H: float = 0.0

    def entropy(self, warped: bool = False) -> float:
        return self.H


class ScriptedEngine:
    """Drafts token 1 at a fixed entropy; the target agrees, and records how many drafts it saw."""

    def __init__(self, entropy: float) -> None:
        self.H = entropy
        self.one_hot = torch.tensor([0.0, 1.0, 0.0, 0.0])
        self.verified: int | None = None

    def draft_step(self, state: SequenceState, drafts: list[int]) -> EntropyStep:
        return EntropyStep(1, self.one_hot, torch.zeros(2), torch.zeros(4), H=self.H)

    def target_probs(self, state: SequenceState, drafts: list[int]) -> torch.Tensor:
        self.verified = len(drafts)
        return self.one_hot.repeat(len(drafts) + 1, 1)


@pytest.mark.parametrize("method", ["svip", "adaedl"])
def test_evaluation_score_and_policy_stop_agree(method: str) -> None:
    """stage=evaluate's score and the bench policy's stop, on the same entropies and the same
    conf/methods constants: the policy stops exactly where the score crosses its threshold."""
    node = compose_config().methods[method]
    if method == "svip":  # stops after the token whose score falls below 1 - h
        threshold = node.h**2 / node.c

        def evaluation_stops(H: np.ndarray) -> np.ndarray:
            return svip_score(H, node) < 1.0 - node.h
    else:  # AdaEDL keeps its first draft, then stops before a token whose bound is below lam
        threshold = (1.0 - node.lam) ** 2 / node.gamma

        def evaluation_stops(H: np.ndarray) -> np.ndarray:
            return adaedl_bound(H, node) < node.lam

    entropies = np.concatenate(
        [np.linspace(0.0, 3 * threshold, 61), np.nextafter(threshold, [-np.inf, np.inf])]
    )
    stops = evaluation_stops(entropies)
    assert stops.any() and not stops.all()  # both sides of the threshold are exercised
    policy = instantiate(node, max_gamma=3)
    for H, stop in zip(entropies.tolist(), stops.tolist(), strict=True):
        engine = ScriptedEngine(H)
        state = SequenceState([0], 1, 16, torch.Generator().manual_seed(0))
        policy.step(engine, state)
        assert engine.verified == (1 if stop else 3), H


def test_heuristic_schedule() -> None:
    assert heuristic_next_gamma(5, accepted=5, drafted=5) == 7
    assert heuristic_next_gamma(5, accepted=2, drafted=5) == 4
    assert heuristic_next_gamma(1, accepted=0, drafted=1) == 1
