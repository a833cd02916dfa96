"""The target's forward time as this run measures it, starting from the latency profile.

SV's scheduler plans with the target's forward time at (rows, tokens a row). The profile
measures it once, before the run, with the plain model over random tokens at one context
length; the run's forwards add the engine's masks and a longer cache with holes, and on a CPU
a forward over a few more tokens a row costs in proportion once the batch fills the cores.
The profile of the offline pair said a batch of 8 verifies 2 tokens a row in the time of 1
(52 vs 51 ms); the bench's forwards took 102 vs 59 ms, so sv kept paying for drafts that the
goodput rule would have refused at the true price. Here each shape the run has executed is
priced by the median of its latest forwards, and a shape not yet seen by the profile scaled
by how the run's own forwards of that width (else of any width) compare with the profile.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

Seconds = Callable[[int, int], float]  # (rows, tokens a row) -> seconds of a target forward
StepCost = Callable[[int], float]  # rows -> seconds of one drafting step


class RunningLatency:
    """Callable like the profile's `target_batch_s`, corrected by `observe`d forwards.

    Planners ask for a dozen shapes a round (sd's planner for every gamma), so each shape's
    median and profiled time are kept, and the scale of a width is computed once between
    observations: a round's planning costs microseconds, not a share of a forward."""

    def __init__(self, prior: Seconds, window: int = 8) -> None:
        self.prior = prior
        self.window = window
        self._seen: dict[tuple[int, int], deque[float]] = {}
        self._medians: dict[tuple[int, int], float] = {}
        self._priors: dict[tuple[int, int], float] = {}  # the profile is fixed: asked once
        self._scales: dict[int, float] = {}  # width -> scale, until the next observation

    def observe(self, rows: int, width: int, seconds: float) -> None:
        """One forward of `rows` rows over a block of `width` tokens took `seconds`."""
        if rows > 0 and width > 0 and seconds > 0:
            times = self._seen.setdefault((rows, width), deque(maxlen=self.window))
            times.append(seconds)
            self._medians[rows, width] = statistics.median(times)
            self._scales.clear()

    def __call__(self, rows: int, width: int) -> float:
        seen = self._medians.get((rows, width))
        if seen is not None:
            return seen
        return self._prior(rows, width) * self._scale(width)

    def _prior(self, rows: int, width: int) -> float:
        shape = (rows, width)
        if shape not in self._priors:
            self._priors[shape] = self.prior(rows, width)
        return self._priors[shape]

    def _scale(self, width: int) -> float:
        """Median of measured / profiled over the shapes of this width, else over all."""
        if width not in self._scales:
            self._scales[width] = 1.0
            for same_width in (True, False):
                ratios = [
                    median / self._prior(r, w)
                    for (r, w), median in self._medians.items()
                    if (w == width or not same_width) and self._prior(r, w) > 0
                ]
                if ratios:
                    self._scales[width] = statistics.median(ratios)
                    break
        return self._scales[width]


def learn(latency: Seconds, forwards: list[tuple[int, int, float]]) -> None:
    """Feed a runner's `forward_times` to `latency` when it learns (a fixed callable does not)."""
    observe = getattr(latency, "observe", None)
    if observe is not None:
        for rows, width, seconds in forwards:
            observe(rows, width, seconds)


class DraftingCost:
    """Seconds of one drafting step by rows, callable like a `StepCost`: the draft's one-token
    forward plus, for a policy that reads it, the companion's, each the profile's figure
    corrected by the run's own one-token forwards (a `RunningLatency` each).

    The profile times each model's plain forward at one context length; the engine runs the
    distilled draft and companion through the lean path, and on the offline pair its steps
    took about half the profiled time, so a scheduler pricing steps at the profile drafted
    less than its own goodput rule asked for. `draft` alone prices a round that skips the
    companion."""

    def __init__(self, draft: StepCost, companion: StepCost | None = None) -> None:
        self.draft_latency = RunningLatency(lambda rows, width: draft(rows))
        self.companion_latency = (
            None if companion is None else RunningLatency(lambda rows, width: companion(rows))
        )

    def learn(self, runners: Mapping[str, Any]) -> None:
        """Feed the draft's and the companion's forward times since the last call."""
        for role, latency in (("draft", self.draft_latency), ("companion", self.companion_latency)):
            runner = runners.get(role)
            if latency is not None and runner is not None:
                learn(latency, runner.forward_times())

    def draft(self, rows: int) -> float:
        return self.draft_latency(rows, 1)

    def companion(self, rows: int) -> float:
        return 0.0 if self.companion_latency is None else self.companion_latency(rows, 1)

    def __call__(self, rows: int) -> float:
        return self.draft(rows) + self.companion(rows)


def learn_steps(step_cost: StepCost, runners: Mapping[str, Any]) -> None:
    """Feed a `DraftingCost` the draft side's forward times (a fixed callable learns nothing)."""
    observe = getattr(step_cost, "learn", None)
    if observe is not None:
        observe(runners)


def draft_step_cost(step_cost: StepCost) -> StepCost:
    """The draft's share of a drafting step: a `DraftingCost`'s `draft`, else the whole."""
    return getattr(step_cost, "draft", step_cost)
