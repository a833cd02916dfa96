"""sd_learned, the learned lossless length policy: its goodput arithmetic, its law and its
greedy output on tiny models, and a case built so that a rule breaking exactness fails.

The law tests follow test_decoding_engine.py's: the first three tokens of >= 20k rows of a
ragged batch against the exact joint law (chi-square), in sampling mode. The exactness case is a
verifier that reads the drafted token's own embedding, so its score depends strongly on x_j:
sd_learned may let it decide only whether x_{j+1} is drafted and keeps the law; a variant
written here that drops the token its score condemns is rejected.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from sprinter_train.__main__ import run_stage
from sprinter_train.bench.run.methods import plan_methods
from sprinter_train.bench.timing.latency import LatencyProfile
from sprinter_train.decoding.batch import Batch, DraftStep, Emitted, Round
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import (
    LearnedLength,
    Method,
    TargetOnly,
    draft_round,
    scores_before_the_draw,
    verify,
)
from sprinter_train.decoding.policies.plans.goodput import expected_accepted, round_goodput
from sprinter_train.decoding.timings import Timings
from sprinter_train.models.tiny import build_tiny_model
from sprinter_train.verifier.checkpoint import (
    save_verifier,
    verifier_path,
)
from sprinter_train.verifier.features import FeatureSpec
from sprinter_train.verifier.labels import Label
from sprinter_train.verifier.scorer import CheckpointVerifier
from tests.decoding_helpers import (
    GREEDY,
    PROMPTS,
    RUNS,
    SAMPLING,
    VOCAB,
    ATable,
    chi_square_pvalue,
    engine_for,
    exact_joint,
    first_tokens,
    fixed_timings,
    ragged_rows,
    tiny_trio,
)
from tests.sd_learned_helpers import (
    after_draw,
    before_draw,
    by_token,
    latency,
    linear_verifier,
    step_cost,
)
from tests.synthetic import write_synthetic_records


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return tiny_trio()


class DropsWhatItScores(Method):
    """The rule sd_learned must not be: draft while the score of x_j is >= 1/2 and, where it is
    not, drop x_j from verification on that score (a stopping rule that looks at x_j itself)."""

    name = "drops_what_it_scores"

    def __init__(self, verifier: CheckpointVerifier) -> None:
        self.verifier = verifier

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        rnd = Round()
        dropped = torch.zeros(len(batch), dtype=torch.bool)

        def stop(step: DraftStep) -> torch.Tensor:
            nonlocal dropped
            low = step.active & (self.verifier(engine, batch, rnd, step) < 0.5)
            dropped = dropped | low
            return low

        draft_round(engine, batch, batch.room(4), stop, rnd=rnd)
        rnd.counts = rnd.counts - dropped.long()
        return verify(engine, batch, rnd)


def test_the_feature_names_say_when_a_score_is_known() -> None:
    def spec(*names: str) -> object:
        return type("V", (), {"spec": FeatureSpec.from_names(names)})()

    assert scores_before_the_draw(spec("hidden"))
    assert scores_before_the_draw(spec("hidden", "draft_entropy"))
    assert not scores_before_the_draw(spec("hidden", "q"))
    assert not scores_before_the_draw(spec("token_embedding"))
    assert not scores_before_the_draw(lambda e, b, r, s: None)  # no names: after the draw


def brute_force_expected(a: list[float], gamma: int) -> float:
    """E(N | gamma) = sum_n n P_gamma(N = n), P_gamma of SV App. D eq. 3."""
    total = 0.0
    for n in range(1, gamma + 1):
        stops_here = (1.0 - a[n]) if n < gamma else 1.0
        total += n * math.prod(a[:n]) * stops_here
    return total


def test_expected_accepted_and_goodput_against_brute_force() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.rand((5, 6), generator=gen, dtype=torch.float64)
    got = expected_accepted(a)
    for r, gamma in itertools.product(range(5), range(1, 7)):
        want = brute_force_expected(a[r].tolist(), gamma)
        assert float(got[r, gamma - 1]) == pytest.approx(want, rel=1e-12)
    assert round_goodput(2.0, 3, 4, latency, step_cost) == pytest.approx(3.0 / (0.15 + 1.4))
    assert round_goodput(0.0, 0, 4, latency, step_cost) == pytest.approx(1.0 / 1.1)


class Scripted:
    """Acceptance a[r][j] of row r's j-th draft, read before the draw (a `hidden` spec) or
    after it (a `q` spec)."""

    def __init__(self, acceptance: list[list[float]], names: tuple[str, ...]) -> None:
        self.acceptance = torch.tensor(acceptance, dtype=torch.float64)
        self.spec = FeatureSpec.from_names(names)

    def __call__(self, engine: Engine, batch: Batch, rnd: Round, step: DraftStep) -> torch.Tensor:
        drawn = 0 if scores_before_the_draw(self) else 1  # the step is in rnd once drawn
        return self.acceptance[:, len(rnd.steps) - drawn]


def best_gamma(a: list[float], max_gamma: int) -> int:
    """The number of drafts maximising (E(N | gamma) + 1) / round time, by brute force."""
    return max(
        range(max_gamma + 1),
        key=lambda g: (brute_force_expected(a, g) + 1) / (g * step_cost(1) + latency(1, g + 1)),
    )


@pytest.mark.parametrize(
    ("names", "acceptance"),
    [
        (("hidden",), [[0.95, 0.9, 0.3, 0.2], [0.5, 0.4, 0.3, 0.2], [0.1] * 4, [0.99] * 4]),
        (("q",), [[0.9] * 4, [0.5] * 4, [0.7] * 4, [0.2] * 4]),  # next estimated as this one
    ],
    ids=["before_the_draw", "after_the_draw"],
)
def test_each_row_drafts_the_length_that_maximises_its_goodput(models, names, acceptance) -> None:
    engine = engine_for(models, SAMPLING)
    policy = LearnedLength(Scripted(acceptance, names), None, max_gamma=4)
    emitted = policy.round(engine, engine.new_batch(PROMPTS, 20, range(4)))
    wanted = [best_gamma(a, 4) for a in acceptance]
    assert emitted.drafted.tolist() == wanted
    assert len(set(wanted)) >= 3  # rows really go their own ways


@pytest.mark.law
@pytest.mark.parametrize("kind", [before_draw, after_draw], ids=lambda k: k.__name__)
def test_sd_learned_keeps_the_target_law_in_ragged_batches(models, kind) -> None:
    policy = kind(models)
    counts = first_tokens(engine_for(models, SAMPLING), policy, ragged_rows(RUNS))
    for prompt, observed in zip(PROMPTS, counts, strict=True):
        expected = exact_joint(models["target"], prompt, 3, SAMPLING, VOCAB)
        assert chi_square_pvalue(observed, expected) > 1e-3, prompt


@pytest.mark.law
def test_dropping_the_token_its_score_condemns_is_off_the_target_law(models) -> None:
    """The power of the test above: the same verifier, used to drop what it scored, fails."""
    policy = DropsWhatItScores(by_token(models))
    counts = first_tokens(engine_for(models, SAMPLING), policy, ragged_rows(RUNS))
    expected = exact_joint(models["target"], PROMPTS[0], 3, SAMPLING, VOCAB)
    assert chi_square_pvalue(counts[0], expected) < 1e-6


@pytest.mark.parametrize("kind", [before_draw, after_draw], ids=lambda k: k.__name__)
def test_greedy_rows_equal_target_only_and_themselves_alone(models, kind) -> None:
    policy = kind(models)
    engine = engine_for(models, GREEDY)
    reference = [engine.generate([p], TargetOnly(), 24)[0].tokens for p in PROMPTS]
    batched = engine.generate(PROMPTS, policy, 24)
    alone = [engine.generate([p], policy, 24)[0].tokens for p in PROMPTS]
    assert [r.tokens for r in batched] == reference == alone
    stats = batched[0].stats
    assert 0 < stats.accepted <= stats.drafted and stats.verifier_calls > 0


@pytest.mark.parametrize("kind", [before_draw, after_draw], ids=lambda k: k.__name__)
def test_a_rows_sampled_tokens_do_not_depend_on_its_batch_mates(models, kind) -> None:
    """Decisions are per row: with a latency that does not depend on the batch size, a row
    drafts, and so draws, the same whoever it is decoded beside."""
    policy = kind(models)
    engine = engine_for(models, SAMPLING)
    alone = engine.generate([PROMPTS[0]], policy, 20, seeds=[7])[0]
    assert alone.stats.drafted > 0
    for mates in ([PROMPTS[1]], [PROMPTS[2], PROMPTS[3], PROMPTS[1]]):
        rows = [*mates[:1], PROMPTS[0], *mates[1:]]
        seeds = [100 + i for i in range(len(rows))]
        seeds[1] = 7
        assert engine.generate(rows, policy, 20, seeds)[1].tokens == alone.tokens


def test_a_round_where_no_average_draft_would_pay_costs_no_draft_forward(models) -> None:
    verifier = linear_verifier(models["draft"], ["hidden"], scale=2.0)
    dear, costs = LearnedLength(verifier, None, max_gamma=4), fixed_timings(step=lambda b: 0.3)
    assert dear.prior == 1.0 and dear.worth_a_draft(costs, 4)  # a sure draft would pay its step
    verifier.prior = 0.01  # type: ignore[attr-defined]  # an average draft would not
    stats = engine_for(models, GREEDY, costs).generate(PROMPTS, dear, 8)[0].stats
    assert stats.draft_calls == stats.companion_calls == stats.drafted == 0
    table = LearnedLength(verifier, ATable(), max_gamma=4)
    assert table.prior == pytest.approx((0.01 + ATable.prior) / 2)


PROFILE = LatencyProfile({1: 30.0, 2: 31.0, 3: 33.0}, 3.0, 2.0, 128, "cpu", "float32")


def test_the_bench_builds_sd_learned_from_the_accept_verifier(compose_cfg, tmp_path) -> None:
    draft = build_tiny_model({}, seed=0)
    bare = plan_methods(compose_cfg("stage=bench", "experiment=bare"), 3, draft, True)
    assert "train.label=accept_prob" in bare.skipped["sd_learned"]
    here = ("stage=bench", "experiment=syn", f"checkpoints_root={tmp_path / 'ck'}")
    cfg = compose_cfg(*here)
    write_synthetic_records(Path(cfg.experiment_dir), rows=2048, d=8, shard_rows=1024)
    run_stage(compose_cfg("stage=tables", "experiment=syn"))
    path = verifier_path(cfg.checkpoint_dir, Label("accept_prob"))
    path.parent.mkdir(parents=True)
    meta = {"lam": None, "label": "accept_prob", "features": {"names": ["hidden"]}}
    save_verifier(path, torch.zeros(8), torch.zeros(1), meta)

    def built(cfg, companion: bool) -> LearnedLength:
        plan = plan_methods(cfg, 3, draft, companion)
        assert "sd_learned" not in plan.skipped
        return plan.policies["sd_learned"]

    with_table = compose_cfg(*here, "methods.sd_learned.table={binning: null, optional: true}")
    policy = built(with_table, True)
    assert isinstance(policy.verifier, CheckpointVerifier) and policy.table is not None
    timings = Timings(**PROFILE.priors())  # the bench's engine's, until the run measures
    _, step_cost = policy.costs(timings)
    assert step_cost(4) == pytest.approx(PROFILE.draft_step_s(4))  # draft + companion
    # the default plans with the verifier alone, as does a table the pair has no companion for
    for alone in (built(cfg, companion=True), built(with_table, companion=False)):
        assert alone.table is None  # the verifier decides alone, and no companion step is paid
        _, step_cost = alone.costs(timings)
        assert step_cost(4) == pytest.approx(PROFILE.draft_batch_ms(4) / 1e3)
