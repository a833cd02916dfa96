"""Does the latency profile describe the machine the bench is about to time?

The profile picks sd's gamma and is where the engine's timings start. One measured while
other jobs shared the cores (which can make a step take several times its time) picks a gamma
that is wrong once the machine is quiet, and the load average cannot tell a burst from a
steady load. So the bench compares the profile with its own forwards: it decodes the warm-up
prompt with sd and takes the median ratio of each batch-1 target forward's time to the
profile's time at that width. Beyond `bench.latency.check_factor` either way, the profile is
measured again; if it still disagrees, sd's gamma is not chosen from it
(`bench.latency.unchecked_gamma`) and the results say so.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from sprinter_train.bench.timing.latency import LatencyProfile
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import SpeculativeDecoding


@dataclass
class ProfileCheck:
    """How far the profile's batch-1 target times are from the run's own (>= 1: folded)."""

    factor: float | None  # None: no batch-1 target forward at a profiled width was timed
    ratio: float | None  # run / profile, unfolded (> 1: the run is slower than the profile)
    forwards: int
    limit: float

    @property
    def agrees(self) -> bool:
        return self.factor is not None and self.factor <= self.limit

    def as_dict(self) -> dict[str, float | int | bool | None]:
        return {**asdict(self), "agrees": self.agrees}


def disagreement(
    profile: LatencyProfile, times: Sequence[tuple[int, int, float]], limit: float
) -> ProfileCheck:
    """The median of (forward seconds / profiled seconds at its width) over the batch-1
    forwards in `times` ((rows, width, seconds), as the engine's timings record them)."""
    ratios = [
        seconds * 1e3 / profile.target_ms[width]
        for rows, width, seconds in times
        if rows == 1 and profile.target_ms.get(width)
    ]
    if not ratios:
        return ProfileCheck(None, None, 0, limit)
    ratio = statistics.median(ratios)
    return ProfileCheck(max(ratio, 1.0 / ratio), ratio, len(ratios), limit)


def check_profile(
    engine: Engine,
    profile: LatencyProfile,
    prompt: Sequence[int],
    gamma: int,
    max_new_tokens: int,
    limit: float,
) -> ProfileCheck:
    """Decode `prompt` with sd at `gamma` (0: target-only rounds) and compare its target
    forwards with `profile`."""
    with engine.timings.recording("target", engine.runners) as times:
        engine.generate([list(prompt)], SpeculativeDecoding(max(0, gamma)), max_new_tokens, [0])
    return disagreement(profile, times, limit)
