"""sd's `gamma: auto`: each round's number of drafts a row, chosen from what the run measured.

A gamma chosen once from the latency profile prices a round at the profile's timings, which
the run's own forwards can contradict (a wide verification dearer than profiled, a draft step
that is not free). Before each round the planner therefore prices gamma = 0..gamma_max by
expected goodput (`goodput.goodputs`) at the engine's timings (`engine.timings`: the target's
forward by rows and tokens a row, the draft's one-token step by rows, each the profile
corrected by the run's forwards) and the acceptance pooled over the run so far; gamma 0 is
plain target decoding (no draft forward at all). Which gamma plays is an `ArmSelector`'s
choice per row count: the gamma kept unless another promises `margin` more goodput, and
every `probe_every` rounds the best other gamma played once.
"""

from __future__ import annotations

from typing import Any

from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies.plans.arms import ArmSelector
from sprinter_train.decoding.policies.plans.goodput import (  # noqa: F401  (best_gamma: the planner's rule)
    AcceptanceRate,
    best_gamma,
    goodputs,
)


class GammaPlanner:
    """Chooses sd's gamma before each round, from earlier rounds only.

    `plan` weighs gamma = 0..gamma_max by `goodputs` at the current rows, the engine's
    timings and the pooled acceptance (`alpha`, the bench's, counted as `weight` judged
    drafts beside the run's). A row count it has not planned starts from `start`, the
    profile's choice; until the acceptance is known (no alpha, nothing judged) it plays that.

    Lossless: the gamma of a round is a function of what was fixed before its first draft is
    drawn (earlier rounds' outcomes and timings, the number of live rows), never of its own
    drafts, so every position is speculative sampling with a number of drafts known in advance,
    which keeps the target's law. In sampling mode a row's tokens do depend on what ran before
    and on its batch-mates (through the timings and the pooled acceptance); its law does not.
    A probe (`ArmSelector`) costs at most 1/probe_every of the rounds at a worse length and
    is, like every plan, fixed before the round's drafts.

    Not priced: the draft's catch-up after rounds without drafts (one forward over the tokens
    it missed) and the first draft step's second token after a fully kept round.
    """

    def __init__(
        self, alpha: float | None, gamma_max: int, margin: float, weight: float, probe_every: int
    ) -> None:
        self.acceptance = AcceptanceRate(alpha, weight)
        self.gamma_max = gamma_max
        self.arms = ArmSelector("sd's planner", range(gamma_max + 1), margin, probe_every, "best")
        self.rounds = self.arms.rounds  # rows -> gamma -> rounds planned so far

    def plan(self, engine: Engine, rows: int, start: int) -> int:
        """Drafts a row for the next round of `rows` live rows."""
        alpha = self.acceptance.value
        values = None
        if alpha is not None:
            timings = engine.timings
            values = goodputs(alpha, rows, self.gamma_max, timings.target, timings.step_cost())
        return self.arms.choose(rows, values, max(0, min(start, self.gamma_max)))

    def observe(self, drafted: int, accepted: int) -> None:
        """A row's round outcome, once it reached the host."""
        self.acceptance.observe(drafted, accepted)

    def record(self) -> dict[str, Any]:
        """The planner's settings and its live tally, as results.json records them."""
        return {
            "prior_alpha": self.acceptance.prior,
            "gamma_max": self.gamma_max,
            "margin": self.arms.margin,
            "weight": self.acceptance.weight,
            "probe_every": self.arms.probe_every,
            "rounds_by_rows_and_gamma": self.rounds,
        }
