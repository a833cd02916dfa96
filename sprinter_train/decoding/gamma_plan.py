"""sd's `gamma: auto`, chosen again every round from what the run has measured.

The bench first picks sd's gamma per batch size from the latency profile (the target's forward
by rows and tokens a row, and a draft step, timed on random tokens at one context length)
and the records' alpha. In session 5's bench on the 2-core CPU that choice stayed at 1 at
every batch size and sd lost 0.22-0.46 of target_only's throughput at batch >= 8: a two-token
forward of 8-16 rows cost far more than profiled, and the draft's step was not free. Like sv,
the planner prices a round with the run's own timings: a `RunningLatency` of the target's
forwards by (rows, tokens a row), another of the draft's one-token steps by rows, and the
acceptance measured so far; it keeps the gamma of highest expected goodput, where 0 is plain
target decoding (no draft forward at all).
"""

from __future__ import annotations

from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.goodput import (  # noqa: F401  (best_gamma: the planner's rule)
    AcceptanceRate,
    StepCost,
    best_gamma,
    goodputs,
    highest,
)
from sprinter_train.decoding.latency import Seconds, learn


class GammaPlanner:
    """Chooses sd's gamma before each round, from earlier rounds only.

    `plan` first feeds the target's and the draft's forward times since its last call to
    `latency` and `draft_latency` (each a `RunningLatency` in the bench; a plain callable
    learns nothing), then weighs gamma = 0..gamma_max by `goodputs` at the current rows and
    the pooled acceptance. It keeps the gamma it used last at this row count unless another
    promises more than `margin` more goodput (hysteresis: medians of noisy timings must not
    make it flap); a row count it has not planned starts from `start`, the profile's choice.

    Lossless: the gamma of a round is a function of what was fixed before its first draft is
    drawn (earlier rounds' outcomes and timings, the number of live rows), never of its own
    drafts, so every position is speculative sampling with a number of drafts known in advance,
    which keeps the target's law. In sampling mode a row's tokens do depend on what ran before
    and on its batch-mates (through the timings and the pooled acceptance); its law does not.

    A gamma's time is only re-measured when it is played, so one slow outlier could park the
    planner on a gamma (0 above all: no draft forward at all) whose rivals it never times
    again. Every `probe_every` rounds at a row count it therefore plays the best other gamma
    once (a probe, tallied as such); that costs at most 1/probe_every of the rounds at a
    worse length and is, like every plan, fixed before the round's drafts (lossless).

    Not priced: the draft's catch-up after rounds without drafts (one forward over the tokens
    it missed) and the first draft step's second token after a fully kept round.
    """

    def __init__(
        self,
        latency: Seconds,
        draft_latency: Seconds,
        alpha: float | None,
        gamma_max: int,
        margin: float = 0.05,
        weight: float = 32.0,
        probe_every: int = 16,
    ) -> None:
        self.latency = latency  # (rows, tokens a row) -> seconds of a target forward
        self.draft_latency = draft_latency  # (rows, tokens a row) -> seconds of a draft forward
        self.acceptance = AcceptanceRate(alpha, weight)
        self.gamma_max = gamma_max
        self.margin = margin
        self.probe_every = probe_every  # 0: never probe
        self._current: dict[int, int] = {}
        self._since_probe: dict[int, int] = {}
        self.rounds: dict[str, dict[str, int]] = {}  # rows -> gamma -> rounds planned so far

    def step_cost(self, rows: int) -> float:
        """Seconds of one drafting step: a one-token draft forward over `rows` rows."""
        return self.draft_latency(rows, 1)

    def plan(self, engine: Engine, rows: int, start: int) -> int:
        """Drafts a row for the next round of `rows` live rows."""
        learn(self.latency, engine.runners["target"].forward_times())
        draft = engine.runners.get("draft")
        if draft is not None:
            learn(self.draft_latency, draft.forward_times())
        gamma = self._current.get(rows, max(0, min(start, self.gamma_max)))
        alpha = self.acceptance.value
        played = gamma
        if alpha is not None:
            values = goodputs(alpha, rows, self.gamma_max, self.latency, self.step_cost)
            best = highest(values)
            if values[best] > values[gamma] * (1.0 + self.margin):
                gamma = played = best
            since = self._since_probe.get(rows, 0) + 1
            if self.probe_every and since >= self.probe_every and self.gamma_max > 0:
                rivals = [g for g in range(len(values)) if g != gamma]
                played = max(rivals, key=lambda g: (values[g], -g))
                since = 0
            self._since_probe[rows] = since
        self._current[rows] = gamma
        tally = self.rounds.setdefault(str(rows), {})
        key = str(played) if played == gamma else f"{played} (probe)"
        tally[key] = tally.get(key, 0) + 1
        return played

    def observe(self, drafted: int, accepted: int) -> None:
        """A row's round outcome, once it reached the host."""
        self.acceptance.observe(drafted, accepted)
