"""The batched engine on tiny models: output laws, greedy equality and batch independence.

Rows of one batch have different prompt lengths and accept different numbers of drafts.
Lossless policies must emit the target's law: the first three generated tokens of >= 20k rows
are compared with the exact joint law (enumerated) by a chi-square test, in sampling mode
(temperature, top-k, top-p). A row's tokens must not depend on its batch-mates (so the law
measured in large batches is the law at any batch size, 1 and 4 included), and greedy rows
must equal target-only decoding token for token in float32.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import binomtest

from sprinter_train.core.sampling import SamplingConfig, warp_probs
from sprinter_train.decoding.batch import Batch, DraftStep, Round
from sprinter_train.decoding.builder import build_engine, build_runner
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.loop import row_fields_read
from sprinter_train.decoding.policies import (
    MTAD,
    SVIP,
    AdaEDL,
    HeuristicSD,
    SpeculativeDecoding,
    SpecVerification,
    SpecVerificationPaper,
    Sprinter,
    TargetOnly,
    companion_features,
    overlap,
    step_features,
)
from sprinter_train.decoding.policies.oracle import OracleLength
from sprinter_train.decoding.policies.plans.companion_plan import MODES
from sprinter_train.models.tiny import build_tiny_model
from tests.decoding_helpers import (
    GREEDY,
    PACK_EVERY,
    PROMPTS,
    RUNS,
    SAMPLING,
    VOCAB,
    ATable,
    ByA,
    MemoRunner,
    assert_target_law_with_power,
    chi_square_pvalue,
    companion_plan,
    engine_for,
    enumerate_joint,
    exact_joint,
    first_tokens,
    fixed_timings,
    ragged_rows,
    smallest_case_engine,
    tiny_trio,
)


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return tiny_trio()


def sv(paper: bool = False):
    kind = SpecVerificationPaper if paper else SpecVerification
    return kind(ATable(), max_gamma=4)


def lossless_policies() -> list:
    return [
        SpeculativeDecoding(gamma=2),
        HeuristicSD(gamma_init=2),
        SVIP(h=0.25, max_gamma=4, c=0.15),
        AdaEDL(gamma=0.3, lam=0.4, max_gamma=4),
        sv(),
        OracleLength(max_gamma=4),
    ]


@pytest.mark.law
@pytest.mark.parametrize("policy", lossless_policies(), ids=lambda p: p.name)
def test_lossless_policies_keep_the_target_law_in_ragged_batches(models, policy) -> None:
    engine = engine_for(models, SAMPLING)
    counts = first_tokens(engine, policy, ragged_rows(RUNS))
    assert_target_law_with_power(models, PROMPTS, counts, SAMPLING, VOCAB)


@pytest.mark.law
def test_sv_paper_rule_is_measurably_off_the_target_law(models) -> None:
    """The published rule drops a drawn token on A's word; with this table it shows."""
    counts = first_tokens(engine_for(models, SAMPLING), sv(paper=True), ragged_rows(RUNS))
    expected = exact_joint(models["target"], PROMPTS[0], 3, SAMPLING, VOCAB)
    assert chi_square_pvalue(counts[0], expected) < 1e-6


@pytest.mark.law
@pytest.mark.parametrize("batch_size", [1, 4])
def test_the_smallest_case_sv_exact_and_the_paper_rule(batch_size: int) -> None:
    """p = q = (1/2, 1/2), c = (1, 0): the paper's rule verifies token 0 and drops token 1,
    so the first token is 0 with probability 3/4; sv keeps 1/2."""
    sampling = SamplingConfig(temperature=1.0)
    runs = 4000
    for paper, share in ((False, 0.5), (True, 0.75)):
        kind = SpecVerificationPaper if paper else SpecVerification
        policy = kind(ByA(), max_gamma=1)
        engine = smallest_case_engine(sampling, fixed_timings(step=lambda b: 0.1))
        zeros = drafted = 0
        for start in range(0, runs, batch_size):
            seeds = range(start, start + batch_size)
            results = engine.generate([[0]] * batch_size, policy, 2, seeds)
            zeros += sum(r.tokens[0] == 0 for r in results)
            drafted += results[0].stats.drafted
        assert drafted > runs / batch_size / 4  # the draft was really used
        assert binomtest(zeros, runs, share).pvalue > 1e-3, (paper, zeros / runs)
        assert binomtest(zeros, runs, 1.25 - share).pvalue < 1e-6  # and the other share fails


@pytest.mark.parametrize(
    "policy", [TargetOnly(), *lossless_policies(), sv(paper=True)], ids=lambda p: p.name
)
def test_greedy_rows_equal_target_only_and_themselves_alone(models, policy) -> None:
    engine = engine_for(models, GREEDY)
    reference = [engine.generate([p], TargetOnly(), 24)[0].tokens for p in PROMPTS]
    batched = engine.generate(PROMPTS, policy, 24)
    alone = [engine.generate([p], policy, 24)[0].tokens for p in PROMPTS]
    assert [r.tokens for r in batched] == reference == alone
    if policy.name not in ("target_only", "sv", "sv_paper"):
        assert 0 < batched[0].stats.accepted <= batched[0].stats.drafted  # drafts took part


def per_row_policies() -> list:
    """Policies whose rows decide alone (everything but sv's shared scheduler)."""
    parity = Sprinter(lambda e, b, r, step: (step.tokens % 2).float(), tau=0.5, max_run=5)
    return [TargetOnly(), *lossless_policies()[:4], sv(paper=True), parity]


@pytest.mark.parametrize("policy", per_row_policies(), ids=lambda p: p.name)
def test_a_rows_sampled_tokens_do_not_depend_on_its_batch_mates(models, policy) -> None:
    engine = engine_for(models, SAMPLING)
    alone = engine.generate([PROMPTS[0]], policy, 20, seeds=[7])[0].tokens
    for mates in ([PROMPTS[1]], [PROMPTS[2], PROMPTS[3], PROMPTS[1]]):
        rows = [*mates[:1], PROMPTS[0], *mates[1:]]
        seeds = [100 + i for i in range(len(rows))]
        seeds[1] = 7
        assert engine.generate(rows, policy, 20, seeds)[1].tokens == alone


class OracleVerifier:
    """Accepts an acceptable token (q(x) <= p(x)) with probability eta_TP, an unacceptable one
    with eta_FP: the verifier Theorem 3.1 assumes, built from the target itself."""

    def __init__(self, target: MemoRunner, eta_TP: float, eta_FP: float, seed: int) -> None:
        self.target, self.eta_TP, self.eta_FP = target, eta_TP, eta_FP
        self.rng = np.random.default_rng(seed)

    def __call__(self, engine: Engine, batch: Batch, rnd: Round, step: DraftStep) -> torch.Tensor:
        scores = torch.zeros(len(batch))
        drafts = rnd.tokens()[:, :-1].tolist()
        for r, (row, active) in enumerate(zip(batch.rows, step.active.tolist(), strict=True)):
            if active:
                p = engine.warp(self.target._row(tuple(row.tokens + drafts[r]))[0])
                x = int(step.tokens[r])
                ok = float(step.q[r, x]) <= float(p[x])
                scores[r] = float(self.rng.random() < (self.eta_TP if ok else self.eta_FP))
        return scores


@pytest.mark.law
def test_sprinter_follows_theorem_3_1_in_ragged_batches(models) -> None:
    eta_FP = 0.4
    verifier = OracleVerifier(MemoRunner(models["target"], VOCAB), 0.8, eta_FP, seed=0)
    policy = Sprinter(verifier, tau=0.5, max_run=8)
    counts = first_tokens(engine_for(models, SAMPLING), policy, ragged_rows(RUNS))
    target, draft = MemoRunner(models["target"], VOCAB), MemoRunner(models["draft"], VOCAB)

    def mixture(seq: tuple[int, ...]) -> torch.Tensor:
        prefix = tuple(PROMPTS[0]) + seq
        p = warp_probs(target._row(prefix)[0], SAMPLING)
        q = warp_probs(draft._row(prefix)[0], SAMPLING)
        return (1 - eta_FP) * p + eta_FP * q

    assert chi_square_pvalue(counts[0], enumerate_joint(mixture, 3)) > 1e-3
    law = exact_joint(models["target"], PROMPTS[0], 3, SAMPLING, VOCAB)
    assert set(counts[0]) - set(law) or chi_square_pvalue(counts[0], law) < 1e-3


def test_sprinter_counts_the_verifiers_and_the_targets_acceptances_apart(models) -> None:
    """`accepted` counts only drafts the target checked and kept, as for sd; tokens committed
    on the verifier's word are `verifier_accepted`."""
    engine = engine_for(models, SAMPLING)

    def run(verifier):
        return engine.generate([PROMPTS[0]], Sprinter(verifier, 0.5, 4), 12)[0].stats

    trusting = run(lambda e, b, r, step: torch.ones(len(b)))
    assert trusting.verifier_accepted == trusting.drafted == 12 and trusting.accepted == 0
    doubting = run(lambda e, b, r, step: torch.zeros(len(b)))
    assert doubting.verifier_accepted == 0 and 0 < doubting.accepted <= doubting.drafted
    mixed = run(lambda e, b, r, step: (step.tokens % 2).float())
    checked = mixed.drafted - mixed.verifier_accepted
    assert mixed.verifier_accepted > 0 and 0 <= mixed.accepted <= checked


def test_restricted_head_draft_runs_in_the_engine() -> None:
    target = build_tiny_model({}, seed=0)
    draft = build_tiny_model(
        {"num_hidden_layers": 1, "embed_rank": 16, "head_vocab_size": 64}, seed=1
    )
    engine = build_engine(
        build_runner(target, VOCAB),
        SAMPLING,
        VOCAB,
        draft=build_runner(draft, VOCAB),
        pack_every=PACK_EVERY,
    )
    results = engine.generate(PROMPTS, SpeculativeDecoding(gamma=3), 12)
    assert all(len(r.tokens) == 12 for r in results) and results[0].stats.drafted > 0


def test_rows_stop_at_eos_and_budget_on_their_own(models) -> None:
    engine = engine_for(models, GREEDY)
    free = [engine.generate([p], TargetOnly(), 10)[0].tokens for p in PROMPTS]
    engine.eos_token_id = free[0][3]
    for policy in (TargetOnly(), SpeculativeDecoding(gamma=4)):
        results = engine.generate(PROMPTS, policy, 10)
        for tokens, result in zip(free, results, strict=True):
            cut = tokens[: tokens.index(free[0][3]) + 1] if free[0][3] in tokens else tokens
            assert result.tokens == cut


def test_mtad_greedy_rows_equal_target_only_alone_and_batched(models) -> None:
    engine = engine_for(models, GREEDY)
    policy = MTAD(gamma=3, beam_width=3, tau=0.5)
    reference = [engine.generate([p], TargetOnly(), 24)[0].tokens for p in PROMPTS]
    batched = engine.generate(PROMPTS, policy, 24)
    alone = [engine.generate([p], policy, 24)[0].tokens for p in PROMPTS]
    assert [r.tokens for r in batched] == reference == alone
    assert 0 < batched[0].stats.accepted <= batched[0].stats.drafted


@pytest.mark.law
def test_mtad_with_tau_one_is_target_sampling_in_ragged_batches(models) -> None:
    policy = MTAD(gamma=3, beam_width=3, tau=1.0)
    counts = first_tokens(engine_for(models, SAMPLING), policy, ragged_rows(RUNS // 4))
    expected = exact_joint(models["target"], PROMPTS[0], 3, SAMPLING, VOCAB)
    assert chi_square_pvalue(counts[0], expected) > 1e-3


def test_mtad_rows_do_not_depend_on_their_batch_mates(models) -> None:
    engine = engine_for(models, SAMPLING)
    policy = MTAD(gamma=3, beam_width=3, tau=0.1)
    alone = engine.generate([PROMPTS[0]], policy, 20, seeds=[7])[0].tokens
    rows = [PROMPTS[2], PROMPTS[0], PROMPTS[1]]
    assert engine.generate(rows, policy, 20, seeds=[1, 7, 2])[1].tokens == alone


def test_sv_skips_drafting_when_no_average_token_would_pay(models) -> None:
    """A prior too low to pay for a drafting step: no draft or companion forward at all."""

    class Hopeless(ATable):
        prior = 0.01

    policy = SpecVerification(Hopeless(), 4)
    results = engine_for(models, GREEDY, fixed_timings(step=lambda b: 0.3)).generate(
        PROMPTS, policy, 8
    )
    stats = results[0].stats
    assert stats.draft_calls == stats.companion_calls == stats.drafted == 0
    reference = engine_for(models, GREEDY).generate(PROMPTS, TargetOnly(), 8)
    assert [r.tokens for r in results] == [r.tokens for r in reference]


@pytest.mark.parametrize("same_head", [True, False], ids=["same-head", "other-head"])
def test_sv_reads_a_restricted_companion_on_the_drafts_head_exactly(same_head: bool) -> None:
    """A companion whose restricted head holds the draft's tokens is handed over on those K
    tokens (no scatter into V); one with other tokens over the vocabulary. Either way S and A
    equal SV's formulas over the vocabulary, from cache-free forwards."""
    target = build_tiny_model({}, seed=0)
    spec = {"num_hidden_layers": 1, "embed_rank": 16, "head_vocab_size": 64}
    draft, companion = build_tiny_model(spec, seed=1), build_tiny_model(spec, seed=2)
    if not same_head:
        companion.lm_head.token_ids.copy_(torch.arange(64) + 30)  # ids 30..93
    sampling = SamplingConfig(temperature=1.0)  # full supports: A and S away from 0 and 1
    engine = build_engine(
        build_runner(target, VOCAB),
        sampling,
        VOCAB,
        draft=build_runner(draft, VOCAB),
        companion=build_runner(companion, VOCAB),
        pack_every=PACK_EVERY,
    )
    batch = engine.new_batch(PROMPTS, 8, range(len(PROMPTS)))
    rnd = Round()
    active = torch.ones(len(PROMPTS), dtype=torch.bool)
    for _ in range(2):  # the round's first step feeds the prompts, the second one draft each
        step = engine.draft_step(batch, rnd, active)
        c = engine.companion_probs(batch, rnd, active)
        rnd.steps.append(step)
        assert c.shape == (len(PROMPTS), 64 if same_head else VOCAB)
        S, A = step_features(step, c)
        assert torch.allclose(overlap(step, c), S)
        reference = MemoRunner(companion, VOCAB)
        drafted = rnd.tokens()[:, :-1].tolist()
        prefixes = [tuple(p + d) for p, d in zip(PROMPTS, drafted, strict=True)]
        c_full = warp_probs(torch.stack([reference._row(p)[0] for p in prefixes]), sampling)
        S_ref, A_ref = companion_features(step.q, c_full, step.tokens)
        assert torch.allclose(S, S_ref, atol=1e-6) and torch.allclose(A, A_ref, atol=1e-6)
        assert (A_ref > 0).any() and (S_ref < 1).all()  # the two models really differ


@pytest.mark.law
def test_sv_with_its_companion_plan_keeps_the_target_law_in_ragged_batches(models) -> None:
    """Rounds that read the companion, rounds that draft at the measured acceptance without
    it and target-only rounds, mixed by the plan (a clock on which every round takes a second,
    so the mode emitting most tokens a round wins and the others are probed): the target's
    law holds."""
    policy = sv()
    policy.companion_plan = companion_plan(
        0.5, warmup=2, probe_every=3, clock=itertools.count().__next__
    )
    engine = engine_for(models, SAMPLING)
    counts = first_tokens(engine, policy, ragged_rows(RUNS))
    assert_target_law_with_power(models, PROMPTS, counts, SAMPLING, VOCAB)
    played = [mode for per_rows in policy.companion_plan.rounds.values() for mode in per_rows]
    assert set(MODES) <= {mode.removesuffix(" (probe)") for mode in played}


def test_sv_drops_a_companion_that_does_not_pay_and_stays_exact(models) -> None:
    """A clock on which a round that read the companion takes 100 s and one without it 1 s:
    after one warm-up round of each mode, sv stops reading the companion (no probes), keeps
    drafting (a prior round emits more tokens than a target round), and greedy rows equal
    target_only's."""
    plan = companion_plan(0.5, warmup=1, probe_every=0)
    now = [0.0]

    def clock() -> float:  # each begin ends the round opened by the one before
        if plan._open is not None:
            now[0] += 100.0 if plan._open["mode"] == "companion" else 1.0
        return now[0]

    plan.clock = clock
    policy = sv()
    policy.companion_plan = plan
    results = engine_for(models, GREEDY).generate(PROMPTS, policy, 24)
    reference = engine_for(models, GREEDY).generate(PROMPTS, TargetOnly(), 24)
    assert [r.tokens for r in results] == [r.tokens for r in reference]
    assert plan.rounds["3-4"]["prior"] > 4 * plan.rounds["3-4"]["companion"] > 0
    stats = results[0].stats
    assert stats.drafted > 0 and stats.companion_calls < stats.draft_calls / 4


@pytest.mark.parametrize("pack_every", [1, 3])
def test_the_tokens_do_not_depend_on_how_often_the_caches_are_packed(models, pack_every) -> None:
    """decoding.pack_every sets the speed only: packing more or less often (here: every
    round, every third, never within the run) moves no sampled token."""
    rows = ragged_rows(6)
    seeds = list(range(len(rows)))

    def tokens(every: int) -> list[list[int]]:
        engine = engine_for(models, SAMPLING)
        engine.pack_every = every
        results = engine.generate(rows, SpeculativeDecoding(gamma=3), 20, seeds)
        return [r.tokens for r in results]

    assert tokens(pack_every) == tokens(10**6)


def test_the_rows_history_is_kept_only_for_a_verifier_that_reads_it(models) -> None:
    """`Batch.state` (the decode-time history features) is updated every round only for a
    policy whose verifier reads it; the others commit without it and emit the same tokens."""
    engine = engine_for(models, GREEDY)
    kept = []
    commit = Engine.commit

    def spy(self, batch, emitted, policy=None):
        kept.append(batch.state is not None)
        return commit(self, batch, emitted, policy)

    def verifier_reading(names):
        def verifier(e, b, r, step):
            if "run_position" in names:
                assert b.state is not None and b.state.run.shape == (len(b),)
            return torch.ones(len(b))

        verifier.spec = SimpleNamespace(names=names)
        return verifier

    cases = [
        (SpeculativeDecoding(gamma=2), False),
        (Sprinter(verifier_reading(("hidden", "q")), 0.5, 4), False),
        (Sprinter(verifier_reading(("q", "run_position")), 0.5, 4), True),
        (Sprinter(lambda e, b, r, step: torch.ones(len(b)), 0.5, 4), True),  # names nothing
    ]
    for policy, reads in cases:
        assert bool(row_fields_read(policy)) is reads
        kept.clear()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Engine, "commit", spy)
            engine.generate(PROMPTS[:2], policy, 8)
        assert kept and set(kept) == {reads}, policy.name


def test_sprinter_checks_its_rejected_rows_whatever_a_stale_any_says(models) -> None:
    """On CUDA `Engine.any` answers with the round's previous flags (the host never waits
    mid-round), which only suits the drafting rows' stop test. SPRINTER's target check of the
    rejected rows must not read it: a stale False dropped rejected tokens unchecked."""

    def generate(engine):
        verifier = lambda e, b, r, step: (step.tokens % 3 != 0).float()  # noqa: E731
        return engine.generate(PROMPTS, Sprinter(verifier, 0.5, 4), 16)

    expected = generate(engine_for(models, SAMPLING))
    stale = engine_for(models, SAMPLING)
    answers: list[bool] = []

    def previous_answer(flags: torch.Tensor) -> bool:  # CUDA's answer, its worst case
        answers.append(bool(flags.any()))
        return answers[-2] if len(answers) > 1 else True

    stale.any = previous_answer
    out = generate(stale)
    assert [r.tokens for r in out] == [r.tokens for r in expected]
    assert out[0].stats.target_calls > 0


def test_the_prompts_prefill_is_kept_apart_within_each_models_forward_time(models) -> None:
    """A decode call's cost (what the latency profile prices) is the model's forward time
    less the prompts' prefill: the prefill is counted once a generation, inside it."""
    engine = engine_for(models, GREEDY)
    before = engine.runners["target"].prefill_seconds
    stats = engine.generate(PROMPTS, SpeculativeDecoding(gamma=2), 6)[0].stats
    assert 0 < stats.target_prefill_seconds < stats.target_seconds
    assert 0 < stats.draft_prefill_seconds < stats.draft_seconds
    spent = engine.runners["target"].prefill_seconds - before
    assert stats.target_prefill_seconds == pytest.approx(spent)
    again = engine.generate(PROMPTS, TargetOnly(), 6)[0].stats
    assert 0 < again.target_prefill_seconds < again.target_seconds
    assert again.draft_prefill_seconds == 0.0  # the draft never ran
