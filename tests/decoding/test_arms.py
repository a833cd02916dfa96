"""The arm selector sd's planner and sv's companion plan are configured from: hysteresis,
warm-up, probes of the best rival or of each in turn, and the tally per key."""

from __future__ import annotations

import pytest

from sprinter_train.decoding.policies.plans.arms import ArmSelector


def test_keeps_its_arm_within_the_margin_and_starts_from_start() -> None:
    arms = ArmSelector("test", range(3), margin=0.1, probe_every=0, rival="best")
    assert arms.choose(4, None, start=1) == 1  # nothing valued yet: the start plays
    assert arms.choose(4, [1.0, 1.05, 1.08], start=0) == 1  # kept: 1.08 is within 10%
    assert arms.choose(4, [1.0, 1.0, 1.2], start=0) == 2  # ahead by more: switched
    assert arms.choose(8, [1.0, 1.05, 1.08], start=0) == 0  # another key, its own start
    assert arms.rounds == {"4": {"1": 2, "2": 1}, "8": {"0": 1}}


def test_warms_up_unvalued_arms_in_order_then_takes_the_best() -> None:
    arms = ArmSelector("test", ("a", "b", "c"), margin=0.5, probe_every=0, rival="turn")
    assert arms.choose(1, [None, None, None]) == "a"
    assert arms.choose(1, [1.0, None, None]) == "b"
    assert arms.choose(1, [1.0, 2.0, 1.5]) == "b"  # no start: the best, margin or not


@pytest.mark.parametrize(
    ("rival", "rounds", "played"),
    [
        ("best", 1, ["a", "a", "c", "a", "a", "c"]),  # the best rival, once
        ("turn", 2, ["a", "a", "b", "b", "a", "a", "c", "c"]),  # each rival in turn, twice
    ],
)
def test_probes_every_few_rounds(rival: str, rounds: int, played: list[str]) -> None:
    arms = ArmSelector("test", "abc", 0.0, probe_every=3, rival=rival, probe_rounds=rounds)
    values = [3.0, 1.0, 2.0]
    assert [arms.choose(0, values) for _ in played] == played
    probes = sum(n for name, n in arms.rounds["0"].items() if name.endswith("(probe)"))
    assert probes == sum(arm != "a" for arm in played)  # every round off the kept arm


def test_rejects_settings_that_cannot_work() -> None:
    for settings in ({"margin": -0.1}, {"probe_every": -1}, {"rival": "worst"}):
        options = {"margin": 0.0, "probe_every": 0, "rival": "best", **settings}
        with pytest.raises(ValueError, match="named:"):
            ArmSelector("named", "ab", **options)
