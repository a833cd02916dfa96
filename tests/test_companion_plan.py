"""sv's companion plan: which mode each round plays, from the goodput measured either way."""

from __future__ import annotations

import pytest

from sprinter_train.decoding.companion_plan import CompanionPlan
from sprinter_train.decoding.state import DecodeStats


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
    """`rounds` rounds of `batch`: each mode's round takes seconds[mode] and emits
    tokens[mode] (one row); returns the modes played."""
    modes = []
    for _ in range(rounds):
        reads = plan.begin(batch)
        modes.append(reads)
        clock.now += seconds[reads]
        plan.observe(drafted=tokens[reads], accepted=tokens[reads] - 1)
        batch.stats.rounds += 1  # the engine's commit
    return modes


def test_warms_up_both_modes_then_keeps_the_faster_and_probes_the_other() -> None:
    clock = Clock()
    plan = CompanionPlan(0.5, window=8, margin=0.05, warmup=3, probe_every=4, clock=clock)
    batch = FakeBatch(1)
    # the companion's rounds emit 2 tokens in 1 s, the prior's 3 tokens in 1.2 s: 2.5 tok/s
    modes = play(plan, batch, clock, 30, {True: 1.0, False: 1.2}, {True: 2, False: 3})
    assert modes[:3] == [True] * 3  # the companion's warm-up first
    assert modes[3:7] == [False] * 4  # the prior's (its third round is timed by the 4th begin)
    later = modes[8:]
    assert later.count(False) > later.count(True) > 0  # kept the prior, probed the companion
    assert plan.goodput["1"]["prior"] == pytest.approx(2.5)
    assert plan.goodput["1"]["companion"] == pytest.approx(2.0)
    assert plan.rounds["1"]["companion (probe)"] >= 1


def test_keeps_the_companion_within_the_margin() -> None:
    clock = Clock()
    plan = CompanionPlan(0.5, window=8, margin=0.10, warmup=2, probe_every=0, clock=clock)
    batch = FakeBatch(2)
    # prior 5% ahead (2.1 vs 2 tokens a second): not worth a switch at a 10% margin
    modes = play(plan, batch, clock, 20, {True: 1.0, False: 1.0}, {True: 2, False: 2.1})
    assert modes[6:] == [True] * 14


def test_switches_back_when_the_companion_pays() -> None:
    clock = Clock()
    plan = CompanionPlan(0.5, window=4, margin=0.0, warmup=2, probe_every=3, clock=clock)
    batch = FakeBatch(1)
    play(plan, batch, clock, 12, {True: 1.0, False: 1.0}, {True: 1, False: 3})
    assert plan._current[1] is False
    modes = play(plan, batch, clock, 24, {True: 1.0, False: 1.0}, {True: 4, False: 1})
    assert modes[-6:].count(True) >= 4 and plan._current[1] is True


def test_rounds_are_timed_within_one_generation_only() -> None:
    clock = Clock()
    plan = CompanionPlan(0.5, warmup=1, clock=clock)
    first = FakeBatch(1)
    play(plan, first, clock, 1, {True: 1.0, False: 1.0}, {True: 2, False: 2})
    clock.now += 50.0  # the next generation's prefill
    second = FakeBatch(1)
    play(plan, second, clock, 1, {True: 1.0, False: 1.0}, {True: 2, False: 2})
    assert plan._measured == {}  # neither round was closed by a round of its own generation
    play(plan, second, clock, 1, {True: 1.0, False: 1.0}, {True: 2, False: 2})
    assert sum(len(times) for times in plan._measured.values()) == 1


def test_a_round_that_was_not_committed_is_not_timed() -> None:
    clock = Clock()
    plan = CompanionPlan(0.5, warmup=1, clock=clock)
    batch = FakeBatch(1)
    plan.begin(batch)
    clock.now += 1.0
    plan.begin(batch)  # no commit in between (a policy's round that raised, say)
    assert plan._measured == {}


def test_only_prior_rounds_feed_the_acceptance() -> None:
    clock = Clock()
    plan = CompanionPlan(None, warmup=2, clock=clock)
    batch = FakeBatch(1)
    modes = []
    for _ in range(5):
        modes.append(plan.begin(batch))
        clock.now += 1.0
        # the companion's rounds keep every draft (its table picked them), the prior's half
        plan.observe(drafted=2, accepted=2 if modes[-1] else 1)
        batch.stats.rounds += 1
    prior_rounds = modes.count(False)
    assert modes[:2] == [True, True] and prior_rounds >= 2
    assert plan.acceptance.checked == 2 * prior_rounds
    assert plan.acceptance.value == pytest.approx(0.5)


@pytest.mark.parametrize(
    "settings", [{"window": 0}, {"warmup": 0}, {"probe_every": -1}, {"margin": -0.1}]
)
def test_rejects_settings_that_cannot_work(settings) -> None:
    with pytest.raises(ValueError, match="companion plan"):
        CompanionPlan(0.5, **settings)
