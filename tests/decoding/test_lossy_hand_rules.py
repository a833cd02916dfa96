"""The lossy frontier's hand rules: Medusa's typical acceptance (decoding/policies/typical.py)
against a brute-force reading of its criterion, and the draft's raw entropy as sprinter's
verifier (decoding/policies/entropy_verifier.py) against `raw_entropy`."""

from __future__ import annotations

import math

import pytest
import torch

from sprinter_train.core.distributions import raw_entropy
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.decoding.batch import DraftStep
from sprinter_train.decoding.policies import Sprinter, TargetOnly
from sprinter_train.decoding.policies.entropy_verifier import EntropyVerifier, entropy_score
from sprinter_train.decoding.policies.typical import (
    TypicalAcceptance,
    typical_accept_lengths,
    typical_threshold,
)
from tests.decoding_helpers import GREEDY, PROMPTS, engine_for, tiny_trio

FULL = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0)  # p > 0 on every token


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return tiny_trio()


def brute_force(p: torch.Tensor, drafts: torch.Tensor, counts: torch.Tensor, eps, delta) -> list:
    """Each row's accepted prefix, read one position at a time in plain Python floats."""
    out = []
    for r in range(p.shape[0]):
        kept = 0
        for j in range(int(counts[r])):
            law = [float(v) for v in p[r, j]]
            h = -sum(v * math.log(v) for v in law if v > 0)
            if law[int(drafts[r, j])] > min(eps, delta * math.exp(-h)):
                kept += 1
            else:
                break
        out.append(kept)
    return out


def test_typical_acceptance_keeps_the_prefix_the_criterion_passes() -> None:
    """Random laws (some sharp, some flat, some with zeros), drafts and counts: the vectorised
    rule keeps, in every row, the prefix a position-by-position reading keeps."""
    gen = torch.Generator().manual_seed(0)
    B, G, V = 64, 5, 7
    scale = torch.rand((B, G, 1), generator=gen) * 6
    logits = torch.randn((B, G, V), generator=gen) * scale
    logits[::5, :, :2] = float("-inf")  # a truncated law: some drafts have p(x) = 0
    p = logits.softmax(-1)
    drafts = torch.randint(0, V, (B, G), generator=gen)
    counts = torch.randint(0, G + 1, (B,), generator=gen)
    for eps, delta in [(0.3, math.sqrt(0.3)), (0.09, 0.3), (0.01, 0.1), (0.5, 0.05)]:
        found = typical_accept_lengths(p, drafts, counts, eps, delta).tolist()
        assert found == brute_force(p, drafts, counts, eps, delta)
        assert all(0 <= n <= int(c) for n, c in zip(found, counts, strict=True))
    threshold = typical_threshold(p, 0.3, 0.5)
    h = -(p * p.clamp(min=1e-30).log()).sum(-1)
    torch.testing.assert_close(threshold, (0.5 * (-h).exp()).clamp(max=0.3))


def test_a_vanishing_epsilon_accepts_every_draft_the_target_gives_mass_to() -> None:
    """ε → 0 (δ = sqrt(ε)): the threshold falls under any p(x) > 0, so every draft of a row is
    kept; a draft with p(x) = 0 never is."""
    gen = torch.Generator().manual_seed(1)
    p = torch.randn((16, 4, 9), generator=gen).softmax(-1)
    drafts = torch.randint(0, 9, (16, 4), generator=gen)
    counts = torch.randint(0, 5, (16,), generator=gen)
    tiny = 1e-12
    assert torch.equal(typical_accept_lengths(p, drafts, counts, tiny, math.sqrt(tiny)), counts)
    zero = p.clone()
    zero[:, 1] = 0.0
    zero[:, 1, 0] = 1.0
    drafts[:, 1] = 3  # p(x) = 0 at the second position: prefixes stop there
    assert typical_accept_lengths(zero, drafts, counts, tiny, math.sqrt(tiny)).tolist() == [
        min(1, int(c)) for c in counts
    ]


def test_typical_acceptance_at_a_vanishing_epsilon_keeps_every_draft_while_decoding(models) -> None:
    """On the tiny trio with p > 0 everywhere, every drafted token is kept: one target call a
    round commits gamma drafts and the target's own token."""
    engine = engine_for(models, FULL)
    policy = TypicalAcceptance(gamma=3, epsilon=1e-12)
    for result in engine.generate(PROMPTS, policy, 12, seeds=range(len(PROMPTS))):
        stats = result.stats
        assert stats.drafted > 0 and stats.accepted == stats.drafted
    assert policy.alpha == pytest.approx(1e-6)
    assert TypicalAcceptance(gamma=3, epsilon=0.09, delta=0.3).alpha == 0.3


def test_typical_acceptance_is_greedy_matching_at_temperature_0(models) -> None:
    """At T = 0 the warped p is one-hot: a draft passes exactly when it is the target's argmax,
    so the method emits target_only's tokens (its traits say greedy_exact), whatever ε."""
    engine = engine_for(models, GREEDY)
    own = [r.tokens for r in engine.generate(PROMPTS, TargetOnly(), 16)]
    for eps in (0.3, 0.01):
        typical = engine.generate(PROMPTS, TypicalAcceptance(gamma=3, epsilon=eps), 16)
        assert [r.tokens for r in typical] == own
    assert TypicalAcceptance.traits.greedy_exact and not TypicalAcceptance.traits.lossless


def test_the_entropy_verifier_scores_exp_minus_the_drafts_raw_entropy() -> None:
    """exp(−H) of the raw softmax at each row's drafted position: 1 for a one-hot draft,
    1/V for a flat one, and lower the flatter the draft, whatever the warped q."""
    logits = torch.tensor(
        [[50.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [2.0, 1.0, 0.0, -1.0], [3.0, 0.0, 0.0, 0.0]]
    )
    step = DraftStep(
        tokens=torch.zeros(4, dtype=torch.long),
        head_q=torch.eye(4)[[0, 0, 0, 0]],  # one-hot warped q: the score does not read it
        hidden=torch.zeros(4, 2),
        head_logits=logits,
        active=torch.ones(4, dtype=torch.bool),
    )
    score = EntropyVerifier()(None, None, None, step)
    assert score.tolist() == pytest.approx(torch.exp(-raw_entropy(logits)).tolist())
    assert score[0] == pytest.approx(1.0, abs=1e-6) and score[1] == pytest.approx(0.25)
    assert score[0] > score[3] > score[2] > score[1]
    assert entropy_score(torch.tensor([0.0, math.log(2)])).tolist() == pytest.approx([1.0, 0.5])


def test_sprinter_with_the_entropy_verifier_is_checked_everywhere_above_every_score(models) -> None:
    """τ above 1 (every score is at most 1): the target checks every draft, so at T = 0 sprinter
    emits target_only's tokens and commits none on the verifier's word; τ near 0 commits
    drafts on the verifier's word."""
    engine = engine_for(models, GREEDY)
    own = [r.tokens for r in engine.generate(PROMPTS, TargetOnly(), 12)]
    strict = engine.generate(PROMPTS, Sprinter(EntropyVerifier(), tau=1.01, max_run=4), 12)
    assert [r.tokens for r in strict] == own
    assert all(r.stats.verifier_accepted == 0 for r in strict)
    lax = engine.generate(PROMPTS, Sprinter(EntropyVerifier(), tau=1e-9, max_run=4), 12)
    assert all(r.stats.verifier_accepted > 0 for r in lax)
