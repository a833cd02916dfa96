"""Whether sv's next round reads its companion, from the goodput the run measured either way.

SV's companion buys information about each draft's acceptance (S before the draw, A after it)
at the price of one more forward per drafting step. The paper's companion is a small model
beside a 13B-72B target, where that forward is a few percent of a round. On the offline pair
on a CPU the companion's step costs what the draft's does, and at batch 1 sv ran at 0.91x sd
with the table's information (the bench of e69a0f4): sd's length, chosen from the pooled
acceptance alone, kept as many tokens per target call for half the drafting time. SV's claim
is to be never worse than the better of target decoding and SD; so sv prices its companion
too. Before each round the plan picks one of two modes:

- `companion`: SV's scheduler, every draft's acceptance predicted through the table;
- `prior`: no companion forward; each row drafts the gamma of highest estimated goodput at
  the acceptance measured in these rounds (sd's rule, `goodput.best_gamma`, 0 included),
  priced with the draft's step alone.

It keeps, per number of live rows, the mode of higher measured goodput (tokens emitted per
second of wall time between round starts, over each mode's latest `window` rounds), switching
only when the other is ahead by `margin`; a row count starts with `warmup` rounds of each mode,
and every `probe_every` rounds the mode not in use plays once, so its figure stays current.

Lossless: a round's mode is fixed before its first draft, from earlier rounds only (their
outcomes and timings); both modes are speculative sampling with stopping times that read only
what is fixed before each draw. In sampling mode a row's tokens depend on the clock; its law
does not.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from sprinter_train.decoding.goodput import AcceptanceRate

MODES = {True: "companion", False: "prior"}


class CompanionPlan:
    """Chooses, before each round, whether sv reads its companion; see the module docstring."""

    def __init__(
        self,
        prior_alpha: float | None,
        window: int = 32,
        margin: float = 0.03,
        warmup: int = 4,
        probe_every: int = 8,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if window < 1 or warmup < 1 or probe_every < 0 or margin < 0:
            raise ValueError(
                f"companion plan: window {window} and warmup {warmup} must be >= 1, "
                f"probe_every {probe_every} and margin {margin} >= 0"
            )
        self.acceptance = AcceptanceRate(prior_alpha)  # the prior rounds' per-draft acceptance
        self.window, self.margin, self.warmup, self.probe_every = (
            window,
            margin,
            warmup,
            probe_every,
        )
        self.clock = clock
        self._measured: dict[tuple[int, bool], deque[tuple[int, float]]] = {}
        self._current: dict[int, bool] = {}
        self._since_probe: dict[int, int] = {}
        self._open: dict[str, Any] | None = None  # the round under way
        # what results.json records, filled in as the run goes
        self.rounds: dict[str, dict[str, int]] = {}  # rows -> mode -> rounds played
        self.goodput: dict[str, dict[str, float]] = {}  # rows -> mode -> measured tokens/s

    def begin(self, batch: Any) -> bool:
        """Start a round of `batch` (closing the previous round of the same generation, whose
        time runs to now); True: read the companion."""
        now = self.clock()
        self._close(batch, now)
        rows = len(batch)
        reads = self._choose(rows)
        self._open = {
            "batch": weakref.ref(batch),
            "round": batch.stats.rounds,
            "rows": rows,
            "reads": reads,
            "start": now,
            "tokens": 0,
        }
        return reads

    def observe(self, drafted: int, accepted: int) -> None:
        """One row's outcome of the round under way, once it reached the host."""
        if self._open is None:
            return
        self._open["tokens"] += accepted + 1
        if not self._open["reads"]:
            self.acceptance.observe(drafted, accepted)

    def _close(self, batch: Any, now: float) -> None:
        """Time the open round if `batch` is its generation, one commit later (a new
        generation's first round follows a prefill, which is no round's time)."""
        opened, self._open = self._open, None
        if opened is None or opened["batch"]() is not batch:
            return
        if batch.stats.rounds != opened["round"] + 1:
            return
        key = (opened["rows"], opened["reads"])
        times = self._measured.setdefault(key, deque(maxlen=self.window))
        times.append((opened["tokens"], now - opened["start"]))
        tokens, seconds = sum(t for t, _ in times), sum(s for _, s in times)
        if seconds > 0:
            self.goodput.setdefault(str(key[0]), {})[MODES[key[1]]] = tokens / seconds

    def _rate(self, rows: int, reads: bool) -> float | None:
        """Measured tokens/s of a mode at this row count, once it has `warmup` rounds."""
        times = self._measured.get((rows, reads), ())
        seconds = sum(s for _, s in times)
        if len(times) < self.warmup or seconds <= 0:
            return None
        return sum(t for t, _ in times) / seconds

    def _choose(self, rows: int) -> bool:
        current = self._current.get(rows, True)
        played = current
        rates = {mode: self._rate(rows, mode) for mode in (True, False)}
        unmeasured = [mode for mode in (True, False) if rates[mode] is None]
        if unmeasured:
            played = unmeasured[0]  # the companion's warm-up first, then the prior's
        else:
            other = not current
            if rates[other] > rates[current] * (1.0 + self.margin):  # type: ignore[operator]
                current = played = other
            since = self._since_probe.get(rows, 0) + 1
            if self.probe_every and since >= self.probe_every:
                played, since = not current, 0
            self._since_probe[rows] = since
        self._current[rows] = current
        tally = self.rounds.setdefault(str(rows), {})
        key = MODES[played] if played == current or unmeasured else f"{MODES[played]} (probe)"
        tally[key] = tally.get(key, 0) + 1
        return played

    def record(self) -> dict[str, Any]:
        """The plan's settings and its live tallies, as results.json records them."""
        return {
            "prior_alpha": self.acceptance.prior,
            "window": self.window,
            "margin": self.margin,
            "warmup": self.warmup,
            "probe_every": self.probe_every,
            "rounds_by_rows_and_mode": self.rounds,
            "goodput_by_rows_and_mode": self.goodput,
        }
