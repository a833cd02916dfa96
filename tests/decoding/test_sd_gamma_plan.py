"""sd's gamma = auto chosen round by round from the run's own timings and acceptance: the
chooser against a brute-force goodput, the hysteresis, the target's law and greedy equality
with target_only while the gamma changes between rounds, gamma 0 as target_only, and the
bench's wiring."""

from __future__ import annotations

from collections import Counter

import pytest

from sprinter_train.bench.run.methods import at_batch_size, plan_methods
from sprinter_train.bench.timing.latency import LatencyProfile
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.decoding.builder import build_engine, build_runner
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import SpeculativeDecoding, TargetOnly
from sprinter_train.decoding.policies.plans.gamma_plan import (
    AcceptanceRate,
    GammaPlanner,
    best_gamma,
)
from sprinter_train.decoding.timings import Seconds, StepCost, Timings
from sprinter_train.models.tiny import build_tiny_model
from tests.decoding_helpers import PACK_EVERY, assert_target_law_with_power, tiny_trio

VOCAB = 128
PROMPTS = [[5, 17, 9, 33], [40, 41, 42, 43, 44, 45, 46], [7, 8], [60, 61, 62]]
SAMPLING = SamplingConfig(temperature=0.9, top_k=4, top_p=0.95)
GREEDY = SamplingConfig(temperature=0)
ROWS = 20000  # rows in batches of 4: three of PROMPTS[0] beside one of another prompt
PLANNER = {"margin": 0.05, "weight": 32.0, "probe_every": 16}  # conf/methods/sd.yaml's


class Measured:
    """An engine, reduced to the timings the planner prices with: the profile's `target`
    forward and `draft` step, corrected by the forwards that `ran` (with `learn`)."""

    def __init__(self, target: Seconds, draft: StepCost, learn: bool = True) -> None:
        self.timings = Timings(target, draft=draft, learn=learn)

    def ran(self, role: str, rows: int, width: int, seconds: float, times: int = 8) -> None:
        self.timings.observe(role, [(rows, width, seconds)] * times)


def brute_goodput(alpha: float, gamma: int, step_s: float, target_s: float) -> float:
    """E(tokens of a round) / its seconds, the expectation summed over the round's outcomes:
    k < gamma drafts kept (probability alpha^k (1 - alpha)) or all gamma (alpha^gamma), each
    followed by the target's token."""
    tokens = sum(alpha**k * (1 - alpha) * (k + 1) for k in range(gamma))
    tokens += alpha**gamma * (gamma + 1)
    return tokens / (gamma * step_s + target_s)


def brute_best(alpha: float, gamma_max: int, step_s: float, target) -> int:
    values = [brute_goodput(alpha, g, step_s, target(g + 1)) for g in range(gamma_max + 1)]
    return values.index(max(values))


def profile_says_drafts_are_cheap(rows: int, width: int) -> float:
    return 0.050 + 0.0001 * width  # a forward over more tokens a row nearly free


def observed_rounds(planner: GammaPlanner, rows: int, rounds: list[tuple[int, int]]) -> None:
    for _ in range(rows):
        for drafted, accepted in rounds:
            planner.observe(drafted, accepted)


def test_acceptance_counts_the_drafts_the_target_judged() -> None:
    rate = AcceptanceRate(None, weight=32.0)
    assert rate.value is None
    rate.observe(3, 3)  # all kept: three checks
    rate.observe(3, 1)  # one kept, the second rejected, the third never judged: two checks
    rate.observe(0, 0)  # no drafts: nothing checked
    assert (rate.kept, rate.checked) == (4, 5) and rate.value == pytest.approx(0.8)
    weighted = AcceptanceRate(0.3, weight=5.0)
    weighted.observe(3, 3)
    assert weighted.value == pytest.approx((0.3 * 5 + 3) / (5 + 3))


def test_gamma_0_when_the_measured_draft_step_costs_more_than_it_gains() -> None:
    """The profile says a draft step is 1 ms and a second token a row free: drafting pays.
    The run measured the draft step at 40 ms and a two-token forward at twice a one-token
    one, at an acceptance of 1/2: no gamma pays, the brute force agrees."""
    measured = Measured(profile_says_drafts_are_cheap, lambda rows: 0.001)
    planner = GammaPlanner(alpha=0.5, gamma_max=6, **PLANNER)
    first = planner.plan(measured, 8, start=0)
    assert first > 0  # on the profile's word
    for width in range(1, 8):
        measured.ran("target", 8, width, 0.050 * width)
    measured.ran("draft", 8, 1, 0.040)
    observed_rounds(planner, 8, [(2, 1), (2, 0), (1, 1)])  # kept 2 of 4 checked a row
    assert planner.acceptance.value == pytest.approx(0.5)
    gamma = planner.plan(measured, 8, start=0)
    assert gamma == 0 == brute_best(0.5, 6, 0.040, lambda n: 0.050 * n)
    assert planner.rounds["8"] == {str(first): 1, "0": 1}


def test_long_rounds_when_the_targets_wide_forward_is_nearly_free() -> None:
    """A measured verification nearly free in its width, a 2 ms draft step and 9 of 10 drafts
    kept: gamma above 1, the brute force's argmax."""
    measured = Measured(lambda rows, width: 0.050 * width, lambda rows: 0.010)  # width costs
    planner = GammaPlanner(alpha=0.2, gamma_max=6, **PLANNER)
    assert planner.plan(measured, 4, start=1) == 0
    target = {n: 0.050 + 0.0005 * n for n in range(1, 8)}
    for width, seconds in target.items():
        measured.ran("target", 4, width, seconds)
    measured.ran("draft", 4, 1, 0.002)
    observed_rounds(planner, 100, [(6, 6), (6, 6), (6, 6), (6, 5), (6, 4)])
    alpha = planner.acceptance.value
    assert alpha > 0.85
    gamma = planner.plan(measured, 4, start=1)
    assert gamma > 1 and gamma == brute_best(alpha, 6, 0.002, target.__getitem__)
    timings = measured.timings
    assert gamma == best_gamma(alpha, 4, 6, timings.target, timings.step_cost())


def test_hysteresis_keeps_the_gamma_unless_another_is_clearly_better() -> None:
    """Two gammas within the margin: the planner keeps the one it started from; once the
    other is clearly better, it moves."""
    target = {1: 1.0, 2: 1.0, 3: 1.0}
    planner = GammaPlanner(0.5, 2, **{**PLANNER, "margin": 0.05})
    measured = Measured(lambda r, n: target[n], lambda r: 0.001, learn=False)
    timings = measured.timings
    assert best_gamma(0.5, 1, 2, timings.target, timings.step_cost()) == 2
    target[3] = 1.14  # gamma 2: 1.75 / 1.142, gamma 1: 1.5 / 1.001 (gamma 2 by 2 %)
    assert best_gamma(0.5, 1, 2, timings.target, timings.step_cost()) == 2
    assert planner.plan(measured, 1, start=1) == 1  # not worth a switch
    target[3] = 1.0
    assert planner.plan(measured, 1, start=1) == 2
    assert planner.plan(measured, 2, start=0) == 2  # each row count starts from `start`


LIMIT = {4: 4, 3: 1, 2: 2, 1: 3}  # rows -> widest target forward that costs a one-token one


def shifting_planner() -> GammaPlanner:
    """A planner whose gamma depends on how many rows are left (at SHIFTING's timings), so a
    round's gamma depends on earlier rounds' outcomes (which rows finished): 3 at four rows, 0
    at three, 1 at two, 2 at one (no hysteresis: each the argmax)."""
    return GammaPlanner(alpha=0.5, gamma_max=3, **{**PLANNER, "margin": 0.0})


SHIFTING = Timings(
    lambda rows, n: 1.0 if n <= LIMIT[rows] else 100.0, draft=lambda rows: 0.001, learn=False
)


def engine_for(models, sampling: SamplingConfig, timings: Timings = SHIFTING) -> Engine:
    return build_engine(
        build_runner(models["target"], VOCAB),
        sampling,
        VOCAB,
        draft=build_runner(models["draft"], VOCAB),
        timings=timings,
        pack_every=PACK_EVERY,
    )


@pytest.fixture(scope="module")
def models():
    return tiny_trio()


@pytest.mark.law
def test_sd_with_a_changing_gamma_keeps_the_target_law(models) -> None:
    engine = engine_for(models, SAMPLING)
    planner = shifting_planner()
    policy = SpeculativeDecoding(2, planner=planner)
    counts = [Counter() for _ in PROMPTS]
    for start in range(0, ROWS, 4):
        batch = [PROMPTS[0], PROMPTS[0], PROMPTS[0], PROMPTS[1 + start // 4 % 3]]
        results = engine.generate(batch, policy, 3, range(start, start + 4))
        for prompt, result in zip(batch, results, strict=True):
            counts[PROMPTS.index(prompt)][tuple(result.tokens)] += 1
    played = {g.split()[0] for per in planner.rounds.values() for g in per}  # probes too
    assert played == {"0", "1", "2", "3"}
    assert_target_law_with_power(models, PROMPTS, counts, SAMPLING, VOCAB)


def test_greedy_rows_equal_target_only_while_gamma_changes(models) -> None:
    engine = engine_for(models, GREEDY)
    reference = [engine.generate([p], TargetOnly(), 24)[0].tokens for p in PROMPTS]
    planner = shifting_planner()
    batched = engine.generate(PROMPTS, SpeculativeDecoding(2, planner=planner), 24)
    assert [r.tokens for r in batched] == reference
    assert 0 < batched[0].stats.accepted <= batched[0].stats.drafted  # drafts took part
    assert len({g for per in planner.rounds.values() for g in per}) > 1


def test_gamma_0_is_target_only_without_a_draft_forward(models) -> None:
    """When no draft pays, sd's rounds are target_only's: the same tokens from the same
    streams (sampling mode), the same target calls, and not one draft forward."""
    engine = engine_for(
        models, SAMPLING, Timings(lambda r, n: 0.05 * n, lambda r: 1.0, learn=False)
    )
    planner = GammaPlanner(0.9, 4, **PLANNER)
    sd = engine.generate(PROMPTS, SpeculativeDecoding(2, planner=planner), 12, [3, 1, 4, 1])
    plain = engine.generate(PROMPTS, TargetOnly(), 12, [3, 1, 4, 1])
    assert [r.tokens for r in sd] == [r.tokens for r in plain]
    assert sd[0].stats.draft_calls == 0 == sd[0].stats.drafted
    assert sd[0].stats.target_calls == plain[0].stats.target_calls
    assert set(planner.rounds["4"]) == {"0"}


def test_the_bench_gives_sd_auto_a_planner_shared_across_batch_sizes(compose_cfg) -> None:
    profile = LatencyProfile({1: 30.0, 2: 31.0}, 3.0, None, 128, "cpu", "float32")
    draft = build_tiny_model({}, seed=0)
    cfg = compose_cfg(
        "stage=bench", "bench.methods=[sd]", "bench.gamma_max=5", "methods.sd.planner.margin=0.1"
    )
    plan = plan_methods(cfg, 4, draft, False, alpha=0.4)
    sd = plan.policies["sd"]
    assert isinstance(sd.planner, GammaPlanner) and sd.gamma == 4
    assert (sd.planner.acceptance.prior, sd.planner.gamma_max) == (0.4, 5)
    assert (sd.planner.arms.margin, sd.planner.arms.probe_every) == (0.1, 16)  # the conf's
    assert sd.planner.acceptance.weight == cfg.methods.sd.planner.weight
    timings = Timings(**profile.priors())  # what the bench's engine prices with, until measured
    assert timings.target(1, 2) == pytest.approx(0.031)
    assert timings.step(1) == pytest.approx(0.003)
    at_8 = at_batch_size(plan, cfg, 2)
    assert at_8.policies["sd"].gamma == 2 and at_8.policies["sd"].planner is sd.planner
    assert at_8.settings["sd"]["planner"]["prior_alpha"] == 0.4
    for fixed in ("methods.sd.gamma=3", "methods.sd.planner=null"):
        plan = plan_methods(
            compose_cfg("stage=bench", "bench.methods=[sd]", fixed), 4, draft, False
        )
        assert plan.policies["sd"].planner is None


def test_a_parked_planner_probes_its_rival_and_leaves_when_it_got_cheap() -> None:
    """One slow reading of the two-token forward parks the planner on gamma 0, where it would
    never time that forward again; the probe every 4th round plays gamma 1 once, the run's
    fresh (fast) readings come in, and the planner moves to drafting."""
    planner = GammaPlanner(0.6, 1, **{**PLANNER, "margin": 0.05, "probe_every": 4})
    measured = Measured(lambda r, n: 1.0, lambda r: 0.01)
    measured.ran("target", 1, 2, 5.0)  # an outlier: two tokens a row look five times dearer
    measured.ran("target", 1, 1, 1.0)
    assert [planner.plan(measured, 1, start=1) for _ in range(3)] == [0, 0, 0]
    assert planner.plan(measured, 1, start=1) == 1  # the probe
    measured.ran("target", 1, 2, 1.05, times=16)  # what the probe (and the truth) measured
    assert planner.plan(measured, 1, start=1) == 1
    assert planner.rounds["1"] == {"0": 3, "1 (probe)": 1, "1": 1}


def test_probes_can_be_switched_off() -> None:
    planner = GammaPlanner(0.1, 2, **{**PLANNER, "probe_every": 0})
    measured = Measured(lambda r, n: float(n), lambda r: 0.01, learn=False)
    assert {planner.plan(measured, 1, start=0) for _ in range(40)} == {0}
