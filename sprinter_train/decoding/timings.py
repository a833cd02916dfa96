"""The run's cost model: what a forward of each model costs, as this run measures it.

Planners price a round by the target's forward over (rows, tokens a row) and each draft-side
model's one-token step by rows. The bench's latency profile times them once, before the run,
with the plain models over random tokens at one context length; the run's forwards add the
engine's masks, a longer cache with holes and, for the distilled draft, the lean path, and on
a CPU a forward over a few more tokens a row costs in proportion once the batch fills the
cores. A planner pricing at the profile alone keeps paying for drafts its own goodput rule
would refuse at the true price (or refuses ones that pay). So each role's cost starts from a
prior (the profile) and is corrected by the run's own forwards (`RunningLatency`).

The engine owns one `Timings` and feeds it every round from its runners' `forward_times`
(their only reader): every policy and planner sharing the engine prices with every forward,
whichever method ran it, and none takes another's observations away.
"""

from __future__ import annotations

import functools
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

Seconds = Callable[[int, int], float]  # (rows, tokens a row) -> seconds of a target forward
StepCost = Callable[[int], float]  # rows -> seconds of one drafting step
Forward = tuple[int, int, float]  # (rows, tokens a row, seconds) of one timed forward
DRAFTING = ("draft",)  # the draft-side models of a plain drafting step


class RunningLatency:
    """A forward's seconds by (rows, tokens a row): the median of the run's latest forwards
    of that shape, else the prior scaled by how the run's forwards of that width (else of
    any width) compare with it.

    Planners ask for a dozen shapes a round (sd's planner for every gamma), so each shape's
    median and prior are kept, and the scale of a width is computed once between
    observations: a round's planning costs microseconds, not a share of a forward."""

    def __init__(self, prior: Seconds, window: int = 8) -> None:
        self.window = window
        self._seen: dict[tuple[int, int], deque[float]] = {}
        self._medians: dict[tuple[int, int], float] = {}
        self.reprice(prior)

    def reprice(self, prior: Seconds) -> None:
        """Start from `prior` from now on, keeping what was observed."""
        self.prior = prior
        self._priors: dict[tuple[int, int], float] = {}  # the prior is fixed: asked once
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
        """Median of measured / prior over the shapes of this width, else over all."""
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


class Timings:
    """The engine's cost model: `target(rows, width)`, the seconds of a target forward over
    `width` tokens a row, and `step(rows, roles)`, of one drafting step over the draft-side
    models `roles` (one token a row each).

    Each role is priced from its prior (`set_priors`; the bench gives its latency profile's)
    corrected by the forwards `feed` hands it; a role without a prior cannot be priced (asking
    raises). `learn=False` prices at the priors alone, whatever ran: a fixed cost model, as
    tests build from plain callables."""

    def __init__(
        self,
        target: Seconds | None = None,
        draft: StepCost | None = None,
        companion: StepCost | None = None,
        *,
        learn: bool = True,
        window: int = 8,
    ) -> None:
        self.learn = learn
        self._priors: dict[str, Seconds | None] = {}
        self._running = {
            role: RunningLatency(_free, window) for role in ("target", "draft", "companion")
        }
        self._recordings: list[tuple[str, list[Forward]]] = []
        self.set_priors(target, draft, companion)

    def set_priors(
        self,
        target: Seconds | None = None,
        draft: StepCost | None = None,
        companion: StepCost | None = None,
    ) -> None:
        """Price each role from these from now on (None: not at all), keeping what the run
        measured so far. A draft-side prior gives one step's seconds by rows."""
        steps = {"draft": draft, "companion": companion}
        self._priors = {
            "target": target,
            **{role: None if step is None else _by_rows(step) for role, step in steps.items()},
        }
        for role, prior in self._priors.items():
            self._running[role].reprice(_free if prior is None else prior)

    def feed(self, runners: Mapping[str, Any]) -> None:
        """Take every forward each runner timed since the last feed (the engine does, once
        a round and when a generation ends)."""
        for role, runner in runners.items():
            if runner is not None:
                self.observe(role, runner.forward_times())

    def observe(self, role: str, forwards: Iterable[Forward]) -> None:
        """Forwards of `role`: (rows, tokens a row, seconds) each."""
        forwards = list(forwards)
        for recorded, seen in self._recordings:
            if recorded == role:
                seen.extend(forwards)
        if self.learn:
            for rows, width, seconds in forwards:
                self._running[role].observe(rows, width, seconds)

    @contextmanager
    def recording(self, role: str, runners: Mapping[str, Any]) -> Iterator[list[Forward]]:
        """The forwards of `role` that `runners` ran inside the block, fed as they come in
        (what they ran before it is fed first, and is not the block's)."""
        self.feed(runners)
        entry: tuple[str, list[Forward]] = (role, [])
        self._recordings.append(entry)
        try:
            yield entry[1]
        finally:
            self.feed(runners)
            self._recordings = [other for other in self._recordings if other is not entry]

    def target(self, rows: int, width: int) -> float:
        """Seconds of a target forward of `rows` rows over `width` tokens a row."""
        return self._seconds("target", rows, width)

    def step(self, rows: int, roles: Sequence[str] = DRAFTING) -> float:
        """Seconds of one drafting step of `rows` rows: a one-token forward of each of `roles`."""
        return sum(self._seconds(role, rows, 1) for role in roles)

    def step_cost(self, roles: Sequence[str] = DRAFTING) -> StepCost:
        """`step` over `roles` as a `StepCost` (what goodput's functions take)."""
        return functools.partial(self.step, roles=tuple(roles))

    def _seconds(self, role: str, rows: int, width: int) -> float:
        prior = self._priors[role]
        if prior is None:
            raise ValueError(
                f"the {role}'s forward has no price: set the engine's timings' priors "
                "(engine.timings.set_priors; the bench gives its latency profile's)"
            )
        return self._running[role](rows, width) if self.learn else prior(rows, width)


def _free(rows: int, width: int) -> float:
    """The placeholder prior of a role without one (never read: `Timings._seconds` raises)."""
    return 0.0


def _by_rows(step: StepCost) -> Seconds:
    """A draft-side step's prior as a forward's: the same at every width."""
    return lambda rows, width: step(rows)
