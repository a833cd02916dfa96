"""sv's companion plan: which mode each round plays, from the goodput measured each way."""

from __future__ import annotations

import pytest

from sprinter_train.decoding.batch import DecodeStats
from sprinter_train.decoding.policies.plans.companion_plan import (
    MODES,
    CompanionPlan,
    band,
    band_label,
)
from tests.decoding_helpers import companion_plan


class FakeBatch:
    """What the plan reads of a batch: its live rows and its committed rounds."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.stats = DecodeStats()

    def __len__(self) -> int:
        return self.rows


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def play(plan: CompanionPlan, batch: FakeBatch, clock: Clock, rounds: int, seconds, tokens):
    """`rounds` rounds of `batch`: a round of mode m takes seconds[m] and emits tokens[m]
    (one row's worth); returns the modes played."""
    modes = []
    for _ in range(rounds):
        mode = plan.begin(batch, 1.0)
        modes.append(mode)
        clock.now += seconds[mode]
        plan.observe(drafted=tokens[mode] - 1, accepted=tokens[mode] - 1)
        batch.stats.rounds += 1  # the engine's commit
    return modes


SLOW_COMPANION = {"companion": 1.0, "prior": 1.2, "target": 1.0}  # seconds a round
TOKENS = {"companion": 2, "prior": 3, "target": 1}  # tokens a round: prior 2.5/s, companion 2/s


def test_warms_up_every_mode_then_keeps_the_fastest_and_probes_the_others() -> None:
    clock = Clock()
    plan = companion_plan(0.5, window=64, margin=0.05, warmup=3, probe_every=8, clock=clock)
    modes = play(plan, FakeBatch(1), clock, 60, SLOW_COMPANION, TOKENS)
    # a mode's first round in a stretch is not timed: warmup + 1 rounds each
    assert modes[:12] == ["companion"] * 4 + ["prior"] * 4 + ["target"] * 4
    later = modes[12:]
    assert later.count("prior") > 2 * (later.count("companion") + later.count("target"))
    assert later.count("companion") > 0 and later.count("target") > 0  # probed in turn
    assert plan.speed["1"] == pytest.approx({"companion": 2.0, "prior": 2.5, "target": 1.0})
    assert plan.rounds["1"]["companion (probe)"] >= 1 and plan.rounds["1"]["target (probe)"] >= 1


def test_keeps_its_mode_within_the_margin() -> None:
    clock = Clock()
    plan = companion_plan(0.5, window=24, margin=0.10, warmup=2, probe_every=2, clock=clock)
    batch, seconds = FakeBatch(2), {m: 1.0 for m in MODES}
    play(plan, batch, clock, 10, seconds, {"companion": 2, "prior": 1.5, "target": 1})
    assert plan.arms.current[2] == "companion"
    # now the prior is 5% ahead (2.1 vs 2 tokens a second): not worth a switch at 10%
    play(plan, batch, clock, 40, seconds, {"companion": 2, "prior": 2.1, "target": 1})
    assert plan.speed["2"]["prior"] == pytest.approx(2.1 / 2)  # tokens a row
    assert plan.arms.current[2] == "companion" and plan.rounds["2"]["prior"] == 3  # its warm-up


def test_target_rounds_win_where_drafting_does_not_pay() -> None:
    clock = Clock()
    plan = companion_plan(0.5, window=64, margin=0.03, warmup=2, probe_every=0, clock=clock)
    seconds = {"companion": 3.0, "prior": 2.5, "target": 1.0}
    modes = play(plan, FakeBatch(8), clock, 20, seconds, {"companion": 2, "prior": 2, "target": 1})
    assert modes[9:] == ["target"] * 11


def test_switches_back_when_the_companion_pays() -> None:
    clock = Clock()
    plan = companion_plan(0.5, window=24, margin=0.0, warmup=2, probe_every=3, clock=clock)
    batch = FakeBatch(1)
    play(plan, batch, clock, 15, {m: 1.0 for m in MODES}, {"companion": 1, "prior": 3, "target": 1})
    assert plan.arms.current[1] == "prior"
    modes = play(
        plan, batch, clock, 40, {m: 1.0 for m in MODES}, {"companion": 4, "prior": 1, "target": 1}
    )
    assert modes[-8:].count("companion") >= 4 and plan.arms.current[1] == "companion"


def test_bands_of_live_rows_share_their_measurements() -> None:
    assert [band(rows) for rows in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 2, 4, 4, 8, 8, 16, 16]
    assert [band_label(key) for key in (1, 2, 4, 8)] == ["1", "2", "3-4", "5-8"]
    clock = Clock()
    plan = companion_plan(0.5, warmup=2, clock=clock)
    play(plan, FakeBatch(4), clock, 4, {m: 1.0 for m in MODES}, TOKENS)
    modes = play(plan, FakeBatch(3), clock, 3, {m: 1.0 for m in MODES}, TOKENS)
    assert modes[0] == "prior"  # rows 3 continue rows 4's warm-up
    assert set(plan.rounds) == {"3-4"}


def test_speed_is_tokens_a_row_per_target_step_so_row_counts_compare() -> None:
    """Companion rounds at 4 rows and prior rounds at 3 rows, every round as fast as a
    target step at its row count: both count as speed 1 (the rows and the step's time cancel),
    where tokens per second would rank the 4-row rounds a third ahead."""
    clock = Clock()
    plan = companion_plan(0.5, warmup=2, probe_every=0, clock=clock)
    steps = {4: 0.04, 3: 0.035}  # a one-token target forward's seconds at 4 and 3 rows
    for rows, mode in ((4, "companion"), (3, "prior")):  # each a generation of its own
        batch = FakeBatch(rows)
        for _ in range(3):  # the first is not timed
            assert plan.begin(batch, steps[rows]) == mode
            clock.now += steps[rows]
            for _ in range(rows):
                plan.observe(drafted=0, accepted=0)
            batch.stats.rounds += 1
        plan.begin(batch, steps[rows])  # closes the generation's last round
    assert plan.speed["3-4"] == pytest.approx({"companion": 1.0, "prior": 1.0})


def test_a_modes_first_round_after_another_is_not_timed() -> None:
    """It pays its models' catch-up (here 10 s against 1 s): timing it would sink the mode."""
    clock = Clock()
    plan = companion_plan(0.5, warmup=2, probe_every=0, clock=clock)
    batch = FakeBatch(1)
    for _ in range(9):  # warm-up: three rounds of each mode, the first of each 10 s long
        plan.begin(batch, 1.0)
        clock.now += 10.0 if plan._open["steady"] is False else 1.0
        plan.observe(drafted=1, accepted=1)
        batch.stats.rounds += 1
    plan.begin(batch, 1.0)
    assert plan.speed["1"] == pytest.approx({"companion": 2.0, "prior": 2.0, "target": 2.0})


def test_rounds_are_timed_within_one_generation_only() -> None:
    clock = Clock()
    plan = companion_plan(0.5, warmup=1, clock=clock)
    first = FakeBatch(1)
    play(plan, first, clock, 1, {m: 1.0 for m in MODES}, TOKENS)
    clock.now += 50.0  # the next generation's prefill
    second = FakeBatch(1)
    play(plan, second, clock, 1, {m: 1.0 for m in MODES}, TOKENS)
    assert plan._measured == {}  # neither round was closed by a round of its own generation
    play(plan, second, clock, 2, {m: 1.0 for m in MODES}, TOKENS)  # the first pays the prefill
    assert sum(len(times) for times in plan._measured.values()) == 1


def test_a_round_that_was_not_committed_is_not_timed() -> None:
    clock = Clock()
    plan = companion_plan(0.5, warmup=1, clock=clock)
    batch = FakeBatch(1)
    plan.begin(batch, 1.0)
    clock.now += 1.0
    plan.begin(batch, 1.0)  # no commit in between (a policy's round that raised, say)
    assert plan._measured == {}


def test_only_prior_rounds_feed_the_acceptance() -> None:
    clock = Clock()
    plan = companion_plan(None, warmup=2, clock=clock)
    batch = FakeBatch(1)
    modes = []
    for _ in range(9):
        modes.append(plan.begin(batch, 1.0))
        clock.now += 1.0
        # the companion's rounds keep every draft (its table picked them), the prior's half
        plan.observe(drafted=2, accepted=2 if modes[-1] == "companion" else 1)
        batch.stats.rounds += 1
    assert modes == ["companion"] * 3 + ["prior"] * 3 + ["target"] * 3
    assert plan.acceptance.checked == 2 * 3  # the three prior rounds only
    assert plan.acceptance.value == pytest.approx(0.5)


@pytest.mark.parametrize(
    "settings",
    [{"window": 23, "warmup": 4}, {"warmup": 0}, {"probe_every": -1}, {"margin": -0.1}],
)
def test_rejects_settings_that_cannot_work(settings) -> None:
    with pytest.raises(ValueError, match="companion plan"):
        companion_plan(0.5, **settings)
