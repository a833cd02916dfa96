"""The engine on tiny models: caches, greedy equality, and the output laws of every policy.

Lossless policies must emit the target's distribution: the first three generated tokens over
20k runs are compared with the exact joint law (enumerated) by a chi-square test, in sampling
mode with temperature, top-k and top-p. SPRINTER with a verifier of known error rates must
follow Theorem 3.1's (1 - eta_FP) p + eta_FP q at every position; MTAD with tau = 1 is
target-only sampling.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from sprinter_train.core.sampling import SamplingConfig, warp_probs
from sprinter_train.decoding.engine import DraftStep, Engine
from sprinter_train.decoding.policies import (
    MTAD,
    SVIP,
    AdaEDL,
    HeuristicSD,
    SpeculativeDecoding,
    SpecVerification,
    Sprinter,
    TargetOnly,
)
from sprinter_train.decoding.runner import CacheSlot, ModelRunner
from sprinter_train.decoding.state import DecodeStats, SequenceState
from sprinter_train.models.tiny import build_tiny_model
from tests.decoding_helpers import MemoRunner, chi_square_pvalue, enumerate_joint, exact_joint

VOCAB = 128
PROMPT = [5, 17, 9, 33]
SAMPLING = SamplingConfig(temperature=0.9, top_k=4, top_p=0.95)
RUNS = 20000


def noisy_copy(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """A draft that agrees with the target often but not always."""
    draft = build_tiny_model({}, seed=0)
    draft.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * scale)
    return draft.eval()


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    target = build_tiny_model({}, seed=0)
    return {
        "target": target,
        "draft": noisy_copy(target, 0.01, 1),
        "companion": noisy_copy(target, 0.02, 2),
    }


def lossless_policies() -> list:
    return [
        SpeculativeDecoding(gamma=2),
        HeuristicSD(gamma_init=2),
        SVIP(h=0.25, max_gamma=4, c=0.15),
        AdaEDL(gamma=0.3, lam=0.4, max_gamma=4),
        SpecVerification(
            table=lambda S, A: 0.2 + 0.6 * A * S, latency=lambda g: 1.0 + 0.1 * g, max_gamma=4
        ),
    ]


def engine_for(models, sampling: SamplingConfig, runner=ModelRunner) -> Engine:
    return Engine(
        runner(models["target"], VOCAB),
        sampling,
        draft=runner(models["draft"], VOCAB),
        companion=runner(models["companion"], VOCAB),
    )


def test_cached_logits_equal_full_forwards(models) -> None:
    """Extending, cropping to a common prefix and extending again never recomputes wrongly."""
    runner = ModelRunner(models["target"], VOCAB)
    slot = CacheSlot()
    sequences = [
        PROMPT,
        PROMPT + [3, 4, 5],
        PROMPT + [3, 9],
        PROMPT + [3, 9, 9, 1, 2],
        PROMPT[:2] + [7],
    ]
    for tokens in sequences:
        out = runner.extend(slot, tokens, keep=2)
        with torch.no_grad():
            full = models["target"](input_ids=torch.tensor([tokens])).logits[0, -2:]
        torch.testing.assert_close(out.logits, full, atol=2e-5, rtol=1e-4)
        assert slot.fed == tokens and slot.cache.get_seq_length() == len(tokens)


def test_restricted_head_draft_runs_in_the_engine() -> None:
    target = build_tiny_model({}, seed=0)
    draft = build_tiny_model(
        {"num_hidden_layers": 1, "embed_rank": 16, "head_vocab_size": 64}, seed=1
    )
    engine = Engine(ModelRunner(target, VOCAB), SAMPLING, draft=ModelRunner(draft, VOCAB))
    result = engine.generate(PROMPT, SpeculativeDecoding(gamma=3), 12, seed=0)
    assert len(result.tokens) == 12 and result.stats.drafted > 0


@pytest.mark.parametrize(
    "policy", lossless_policies() + [MTAD(gamma=3, beam_width=3, tau=0.5)], ids=lambda p: p.name
)
def test_greedy_output_equals_target_only(models, policy) -> None:
    """Greedy p and q are one-hot, so even MTAD's joint test accepts exactly the agreeing prefix."""
    engine = engine_for(models, SamplingConfig(temperature=0))
    for prompt in (PROMPT, [40, 41, 42, 43, 44, 45]):
        reference = engine.generate(prompt, TargetOnly(), 24).tokens
        result = engine.generate(prompt, policy, 24)
        assert result.tokens == reference
    assert 0 < result.stats.accepted <= result.stats.drafted  # the draft really took part


def sample_first_tokens(engine: Engine, policy, runs: int) -> Counter:
    return Counter(tuple(engine.generate(PROMPT, policy, 3, seed=s).tokens) for s in range(runs))


@pytest.mark.parametrize("policy", lossless_policies(), ids=lambda p: p.name)
def test_lossless_policies_keep_the_target_distribution(models, policy) -> None:
    engine = engine_for(models, SAMPLING, runner=MemoRunner)
    counts = sample_first_tokens(engine, policy, RUNS)
    expected = exact_joint(models["target"], PROMPT, 3, SAMPLING, VOCAB)
    assert chi_square_pvalue(counts, expected) > 1e-3
    # the test has power: the same counts reject the mixture halfway between the target's and
    # the draft's law (not the draft's own: it may give generated outcomes probability 0)
    draft = exact_joint(models["draft"], PROMPT, 3, SAMPLING, VOCAB)
    halfway = {k: (expected.get(k, 0.0) + draft.get(k, 0.0)) / 2 for k in {*expected, *draft}}
    assert chi_square_pvalue(counts, halfway) < 1e-6


def test_mtad_with_tau_one_is_target_sampling(models) -> None:
    engine = engine_for(models, SAMPLING, runner=MemoRunner)
    counts = sample_first_tokens(engine, MTAD(gamma=3, beam_width=3, tau=1.0), RUNS)
    assert (
        chi_square_pvalue(counts, exact_joint(models["target"], PROMPT, 3, SAMPLING, VOCAB)) > 1e-3
    )


class OracleVerifier:
    """Accepts an acceptable token (q(x) <= p(x)) with probability eta_TP, an unacceptable one
    with eta_FP: the verifier Theorem 3.1 assumes, built from the target itself."""

    def __init__(self, target: MemoRunner, eta_TP: float, eta_FP: float, seed: int) -> None:
        self.target, self.eta_TP, self.eta_FP = target, eta_TP, eta_FP
        self.rng = np.random.default_rng(seed)

    def __call__(
        self, engine: Engine, state: SequenceState, drafts: list[int], step: DraftStep
    ) -> float:
        logits = self.target._row(tuple(state.tokens + drafts))[0]
        p = engine.warp(logits)
        acceptable = float(step.q[step.token]) <= float(p[step.token])
        return float(self.rng.random() < (self.eta_TP if acceptable else self.eta_FP))


def sprinter_joint(models, eta_FP: float, n: int) -> dict[tuple[int, ...], float]:
    """Theorem 3.1 at every position: prod_t ((1 - eta_FP) p + eta_FP q)(x_t | prefix)."""
    target, draft = MemoRunner(models["target"], VOCAB), MemoRunner(models["draft"], VOCAB)

    def mixture(seq: tuple[int, ...]) -> torch.Tensor:
        prefix = tuple(PROMPT) + seq
        p = warp_probs(target._row(prefix)[0], SAMPLING)
        q = warp_probs(draft._row(prefix)[0], SAMPLING)
        return (1 - eta_FP) * p + eta_FP * q

    return enumerate_joint(mixture, n)


def test_sprinter_follows_theorem_3_1(models) -> None:
    engine = engine_for(models, SAMPLING, runner=MemoRunner)
    verifier = OracleVerifier(MemoRunner(models["target"], VOCAB), eta_TP=0.8, eta_FP=0.4, seed=0)
    counts = sample_first_tokens(engine, Sprinter(verifier, tau=0.5, max_run=8), RUNS)
    assert chi_square_pvalue(counts, sprinter_joint(models, 0.4, 3)) > 1e-3
    # and it is measurably not the target's law (the test can tell the two apart)
    target = exact_joint(models["target"], PROMPT, 3, SAMPLING, VOCAB)
    assert set(counts) - set(target) or chi_square_pvalue(counts, target) < 1e-3


def test_sprinter_counts_the_verifiers_and_the_targets_acceptances_apart(models) -> None:
    """`accepted` counts only drafts the target checked and kept, as for sd; tokens committed
    on the verifier's word are `verifier_accepted`."""
    engine = engine_for(models, SAMPLING)

    def run(verifier) -> DecodeStats:
        return engine.generate(PROMPT, Sprinter(verifier, tau=0.5, max_run=4), 12, seed=0).stats

    trusting = run(lambda *args: 1.0)  # every run committed unchecked
    assert trusting.verifier_accepted == trusting.drafted == 12 and trusting.accepted == 0
    doubting = run(lambda *args: 0.0)  # every draft checked by the target, one per call
    assert doubting.verifier_accepted == 0 and 0 < doubting.accepted <= doubting.drafted
    mixed = run(lambda e, s, d, step: float(step.token % 2))
    checked = mixed.drafted - mixed.verifier_accepted
    assert mixed.verifier_accepted > 0 and 0 <= mixed.accepted <= checked


@pytest.mark.parametrize("sampling", [SamplingConfig(0), SAMPLING], ids=["greedy", "sampled"])
def test_every_method_runs_end_to_end(models, sampling) -> None:
    engine = engine_for(models, sampling)
    policies = [TargetOnly(), *lossless_policies(), MTAD(gamma=3, beam_width=2, tau=0.1)]
    policies.append(Sprinter(lambda e, s, d, st: float(st.token % 2), tau=0.5, max_run=5))
    for policy in policies:
        result = engine.generate(PROMPT, policy, 16, seed=3)
        assert len(result.tokens) == 16, policy.name
        assert all(0 <= t < VOCAB for t in result.tokens)
        assert result.stats.accepted + result.stats.verifier_accepted <= result.stats.drafted
        assert result.stats.target_calls >= 1 and result.wall_s > 0


def test_generation_stops_at_eos(models) -> None:
    engine = engine_for(models, SamplingConfig(0))
    free = engine.generate(PROMPT, TargetOnly(), 10).tokens
    engine.eos_token_id = free[3]
    for policy in (TargetOnly(), SpeculativeDecoding(gamma=4)):
        assert engine.generate(PROMPT, policy, 10).tokens == free[: free.index(free[3]) + 1]
