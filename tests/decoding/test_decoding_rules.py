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
    accept_lengths,
    adaedl_should_stop,
    heuristic_next_gamma,
    mtad_accept_lengths,
    residual_rows,
    speculative_rows,
    speculative_step,
    sprinter_check_rows,
    sv_expected_accepted,
    sv_goodput,
    sv_prob_accept_count,
    svip_should_stop,
)
from sprinter_train.core.sampling import SamplingConfig, inverse_cdf, sample, warp_probs
from sprinter_train.core.streams import RowStreams
from sprinter_train.decoding.batch import Batch, DraftStep, Row
from sprinter_train.decoding.policies.registry import traits_of
from sprinter_train.decoding.runner.runner import RowOutput


def random_dist(rng: np.random.Generator, n: int, zeros: int = 0) -> torch.Tensor:
    w = rng.gamma(0.7, size=n)
    w[rng.choice(n, zeros, replace=False)] = 0
    return torch.tensor(w / w.sum(), dtype=torch.float64)


def test_residual_is_normalised_positive_part() -> None:
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.2, 0.5, 0.1, 0.2], [0.25, 0.25, 0.25, 0.25]])
    residual = residual_rows(p, q)
    torch.testing.assert_close(residual[0], torch.tensor([0.75, 0.0, 0.25, 0.0]))
    assert torch.equal(residual[1], p[1])  # nothing to correct: fall back to p


def test_accept_length_stops_at_first_failed_ratio_within_each_rows_count() -> None:
    p_x = torch.tensor([[0.5, 0.1, 0.5]] * 4)
    q_x = torch.tensor([[0.5, 0.9, 0.5]] * 4)  # ratios p/q: 1.0, 0.111, 1.0
    u = torch.tensor([[0.99, 0.05, 0.5], [0.99, 0.2, 0.5], [0.99, 0.05, 0.5], [0.5, 0.5, 0.5]])
    counts = torch.tensor([3, 3, 1, 0])
    assert accept_lengths(p_x, q_x, u, counts).tolist() == [3, 1, 1, 0]


def test_speculative_rows_emit_the_target_law_on_every_row() -> None:
    """x ~ q then the rule, 20k rows at once: the first emitted token is distributed as p
    (Leviathan Thm. 1), also on rows whose draft is not counted (they emit from p)."""
    rng = np.random.default_rng(0)
    p, q = random_dist(rng, 6, zeros=1), random_dist(rng, 6, zeros=2)
    n = 20000
    streams = RowStreams(list(range(n)))
    x = inverse_cdf(q.expand(n, -1), streams.uniform(1)[:, 0])
    counts = torch.tensor([1, 1, 1, 0]).repeat(n // 4)
    accepted, law = speculative_rows(
        p.expand(n, 2, -1), q.expand(n, 1, -1), x[:, None], counts, streams.uniform(1)
    )
    token = inverse_cdf(law, streams.uniform(1)[:, 0])
    emitted = torch.where(accepted > 0, x, token).numpy()
    assert (accepted <= counts).all()
    tally = np.bincount(emitted, minlength=6)
    assert tally[p.numpy() == 0].sum() == 0
    support = p.numpy() > 0
    assert chisquare(tally[support], n * p.numpy()[support]).pvalue > 1e-3


def test_sprinter_check_is_speculative_sampling_of_one_token() -> None:
    rng = np.random.default_rng(3)
    p, q = random_dist(rng, 5), random_dist(rng, 5)
    n = 20000
    streams = RowStreams(list(range(n)))
    x = inverse_cdf(q.expand(n, -1), streams.uniform(1)[:, 0])
    kept, token = sprinter_check_rows(
        p.expand(n, -1), q.expand(n, -1), x, streams.uniform(1)[:, 0], streams.uniform(1)[:, 0]
    )
    assert torch.equal(token[kept], x[kept]) and 0 < int(kept.sum()) < n
    assert chisquare(np.bincount(token.numpy(), minlength=5), n * p.numpy()).pvalue > 1e-3


def test_sample_follows_probabilities_and_skips_zeros() -> None:
    probs = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3, 0.0])
    gen = torch.Generator().manual_seed(0)
    counts = np.bincount([int(sample(probs, gen)) for _ in range(20000)], minlength=6)
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


def test_mtad_takes_the_longest_passing_prefix_within_each_rows_count() -> None:
    p_x = torch.tensor([[0.9, 0.2, 0.5]] * 2)  # p joint: 0.9, 0.18, 0.09
    q_joint = torch.tensor([[0.8, 0.5, 0.1]] * 2)  # ratios 1.0, 0.36, 0.9
    full, short = torch.tensor([3, 3]), torch.tensor([3, 2])
    assert mtad_accept_lengths(p_x, q_joint, full, tau=0.5).tolist() == [3, 3]  # the longest
    assert mtad_accept_lengths(p_x, q_joint, short, tau=0.5).tolist() == [3, 1]
    assert mtad_accept_lengths(p_x, q_joint, full, tau=0.95).tolist() == [1, 1]
    assert mtad_accept_lengths(p_x, q_joint, full, tau=1.0).tolist() == [0, 0]  # target only


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
    """Drafted tokens whose draft entropies are set, not computed from logits."""

    H: torch.Tensor | None = None

    def entropy(self, warped: bool = False) -> torch.Tensor:
        return self.H


class ScriptedEngine:
    """Drafts token 1 in every row at that row's fixed entropy; the target agrees."""

    device = torch.device("cpu")

    def __init__(self, entropies: torch.Tensor) -> None:
        self.H = entropies
        self.one_hot = torch.zeros(len(entropies), 4)
        self.one_hot[:, 1] = 1.0

    def any(self, flags: torch.Tensor) -> bool:
        return bool(flags.any())

    def tensor(self, values) -> torch.Tensor:
        return torch.tensor(list(values))

    def draft_step(self, batch, rnd, active, keep=None, scorer=None) -> EntropyStep:
        B = len(self.H)
        step = EntropyStep(
            torch.ones(B, dtype=torch.long),
            self.one_hot,
            torch.zeros(B, 2),
            self.one_hot,
            active,
            H=self.H,
        )
        if keep is not None:
            step.active = active & keep(step)
        return step

    def target_probs(self, batch, rnd, active, then=None) -> torch.Tensor:
        probs = self.one_hot[:, None, :].expand(-1, len(rnd.steps) + 1, -1)
        batch.verified = RowOutput(probs.log(), torch.zeros(len(self.H), 1, 2))  # not checked
        return probs

    def sample(self, probs, batch, active) -> torch.Tensor:
        return probs.argmax(-1)


@pytest.mark.parametrize("method", ["svip", "adaedl"])
def test_evaluation_score_and_policy_stop_agree(method: str) -> None:
    """stage=evaluate's score and the bench policy's stop, on the same entropies and the same
    conf/methods constants: the policy stops exactly where the score crosses its threshold."""
    node = compose_config().methods[method]
    score = traits_of(node, method).record_score  # what stage=evaluate scores records with

    def evaluation_score(H: np.ndarray) -> np.ndarray:
        return score.score({"draft_entropy": H, "draft_entropy_raw": H}, node)

    if method == "svip":  # stops after the token whose score falls below 1 - h
        threshold = node.h**2 / node.c

        def evaluation_stops(H: np.ndarray) -> np.ndarray:
            return evaluation_score(H) < 1.0 - node.h
    else:  # AdaEDL keeps its first draft, then stops before a token whose bound is below lam
        threshold = (1.0 - node.lam) ** 2 / node.gamma

        def evaluation_stops(H: np.ndarray) -> np.ndarray:
            return evaluation_score(H) < node.lam

    entropies = np.concatenate(
        [np.linspace(0.0, 3 * threshold, 61), np.nextafter(threshold, [-np.inf, np.inf])]
    )
    stops = evaluation_stops(entropies)
    assert stops.any() and not stops.all()  # both sides of the threshold are exercised
    policy = instantiate(node, max_gamma=3)
    rows = [Row(i, [0], 1, 16) for i in range(len(entropies))]
    batch = Batch(rows, RowStreams(list(range(len(rows)))), {}, {})
    emitted = policy.round(ScriptedEngine(torch.tensor(entropies)), batch)
    expected = [1 if stop else 3 for stop in stops.tolist()]
    assert emitted.drafted.tolist() == expected


def test_heuristic_schedule() -> None:
    assert heuristic_next_gamma(5, accepted=5, drafted=5) == 7
    assert heuristic_next_gamma(5, accepted=2, drafted=5) == 4
    assert heuristic_next_gamma(1, accepted=0, drafted=1) == 1


def test_a_speculative_step_takes_the_numbers_the_sequential_draws_took() -> None:
    """`speculative_step` on the rows' next G + 1 numbers (shown, then taken by counts + 1:
    what a captured verify does) accepts and draws what the tests' G numbers and the draw's
    next one did taken one call after the other, and leaves the same counters."""
    gen = torch.Generator().manual_seed(3)
    B, G, V = 6, 3, 5
    p = torch.rand((B, G + 1, V), generator=gen)
    q = torch.rand((B, G, V), generator=gen)
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    drafts = torch.randint(0, V, (B, G), generator=gen)
    counts = torch.tensor([0, 1, 2, 3, 3, 2])
    shown, taken = RowStreams(list(range(B))), RowStreams(list(range(B)))
    for _ in range(40):  # across block refills
        accepted, token = speculative_step(p, q, drafts, counts, shown.peek(G + 1))
        shown.advance(G + 1, counts + 1)
        want, law = speculative_rows(p, q, drafts, counts, taken.uniform(G, counts))
        assert torch.equal(accepted, want)
        assert torch.equal(token, inverse_cdf(law, taken.uniform(1)[:, 0]))
        assert torch.equal(shown.counters, taken.counters)
