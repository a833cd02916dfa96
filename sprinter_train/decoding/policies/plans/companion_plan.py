"""How sv's next round drafts (with its companion, without it, or not at all), by measured speed.

SV's companion buys information about each draft's acceptance (S before the draw, A after it)
at the price of one more forward per drafting step. Beside the paper's 13B-72B targets that
forward is a few percent of a round; where the companion's step costs what the draft's does,
sd's length, chosen from the pooled acceptance alone, can keep as many tokens per target call
for half the drafting time (docs/results/bench-batches.md). SV's claim is to be never worse
than the better of target decoding and SD; so sv prices its companion, and its drafting, by
what they bought. Before each round the plan picks one of three modes:

- `companion`: SV's scheduler, every draft's acceptance predicted through the table;
- `prior`: no companion forward; each row drafts the gamma of highest estimated goodput at
  the acceptance measured in these rounds (sd's rule, `goodput.best_gamma`), priced with the
  draft's step alone;
- `target`: no draft either, one token a row from the target (target_only's round): the
  goodput model prices forwards, not the host's work around them, so where it expects drafts
  to pay by a little they can still lose to the target alone.

It keeps, per band of live rows (1, 2, 3-4, 5-8, ...: a batch whose rows finish one by one
passes through every count, and each count warming up three modes would be all warm-up), the
mode of highest measured speed: an `ArmSelector` that switches only when another mode is
ahead by `margin`. A round's speed is its tokens a row over its wall time (round start to
round start) counted in target forwards of one token at its number of rows (the engine's
timings): the tokens/s of a round depend on how many rows are left and how long their
contexts are, which differ between the rounds two modes happened to play in, while this ratio
is a round's speedup over a target-only round and compares modes played at 9 rows and at 16.
Each mode's figure is taken over the band's latest `window` rounds, one horizon for every
mode, not each mode's own latest rounds: the mode in use would be judged on the last few
rounds and the probed ones on the whole run. A band starts with `warmup` timed rounds of
each mode in turn (then the best of them, margin or not), and every `probe_every` rounds one
of the modes not in use plays two rounds (in turn), so their figures stay current. Only a
round that follows a round of the same mode in its generation is timed: the first pays its
models' prefill or catch-up (`CompanionPlan._close`).

Lossless: a round's mode is fixed before its first draft, from earlier rounds only (their
outcomes and timings); every mode is speculative sampling with stopping times that read only
what is fixed before each draw (the target's round: none). In sampling mode a row's tokens
depend on the clock; its law does not.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from sprinter_train.decoding.policies.plans.arms import ArmSelector
from sprinter_train.decoding.policies.plans.goodput import AcceptanceRate

MODES = ("companion", "prior", "target")


def band(rows: int) -> int:
    """The power of two at or above `rows`: the plan's key (bands 1, 2, 3-4, 5-8, ...)."""
    return 1 << max(0, rows - 1).bit_length()


def band_label(key: int) -> str:
    low = key // 2 + 1
    return str(key) if low >= key else f"{low}-{key}"


class CompanionPlan:
    """Chooses, before each round, how sv drafts (`MODES`); see the module docstring."""

    def __init__(
        self,
        prior_alpha: float | None,
        window: int,
        margin: float,
        warmup: int,
        probe_every: int,
        weight: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if warmup < 1 or window < 2 * len(MODES) * warmup:
            raise ValueError(
                f"companion plan: warmup {warmup} must be >= 1 and window {window} at least "
                f"{2 * len(MODES)} x warmup (room for every mode's warm-up)"
            )
        # the prior rounds' per-draft acceptance, the bench's alpha counted as `weight` drafts
        self.acceptance = AcceptanceRate(prior_alpha, weight)
        self.window, self.warmup = window, warmup
        self.arms = ArmSelector(
            "companion plan", MODES, margin, probe_every, "turn", probe_rounds=2, label=band_label
        )  # a probe's first round pays its catch-up, untimed: it plays two
        self.clock = clock
        self._measured: dict[tuple[int, str], deque[tuple[int, float, float]]] = {}
        self._begun: dict[int, int] = {}  # rounds begun per band: the horizon's clock
        self._open: dict[str, Any] | None = None  # the round under way
        # what results.json records, filled in as the run goes
        self.rounds = self.arms.rounds  # band of rows -> mode -> rounds played
        self.speed: dict[str, dict[str, float]] = {}  # band -> mode -> measured speed

    def begin(self, batch: Any, target_step: float) -> str:
        """Start a round of `batch` (closing the previous round of the same generation, whose
        time runs to now); returns its mode, one of `MODES`. `target_step`: the seconds of a
        one-token target forward at this many rows, the unit the round's time is counted in."""
        now = self.clock()
        previous = self._close(batch, now)
        key = band(len(batch))
        self._begun[key] = index = self._begun.get(key, 0) + 1
        mode = self.arms.choose(key, [self._rate(key, mode) for mode in MODES])
        self._open = {
            "steady": previous == mode,
            "index": index,
            "batch": weakref.ref(batch),
            "round": batch.stats.rounds,
            "band": key,
            "mode": mode,
            "start": now,
            "unit": target_step if target_step > 0 else 1.0,
            "rows": len(batch),
            "tokens": 0,
        }
        return mode

    def observe(self, drafted: int, accepted: int) -> None:
        """One row's outcome of the round under way, once it reached the host."""
        if self._open is None:
            return
        self._open["tokens"] += accepted + 1
        if self._open["mode"] == "prior":
            self.acceptance.observe(drafted, accepted)

    def _close(self, batch: Any, now: float) -> str | None:
        """Time the open round if `batch` is its generation, one commit later, and the round
        before it in this generation played the same mode; return the open round's mode
        (None: no round of this generation was open).

        A mode's first round in a generation, or after another mode, pays for the forwards
        its models skipped meanwhile: the target's, the draft's and the companion's prefill
        of the prompts in a generation's first round, and a catch-up over the tokens they
        missed after a switch. Such a round costs many steady rounds, and timing it would
        rank whichever mode a generation happened to start with last. Those rounds are not
        timed, so speeds are steady-state (probes play two rounds)."""
        opened, self._open = self._open, None
        if opened is None or opened["batch"]() is not batch:
            return None
        if batch.stats.rounds != opened["round"] + 1:
            return None
        if not opened["steady"]:
            return opened["mode"]
        key = (opened["band"], opened["mode"])
        times = self._measured.setdefault(key, deque(maxlen=self.window))
        steps = (now - opened["start"]) / opened["unit"]
        times.append((opened["index"], opened["tokens"] / opened["rows"], steps))
        rate = self._rate(*key, least=1)
        if rate is not None:
            self.speed.setdefault(band_label(key[0]), {})[key[1]] = rate
        return opened["mode"]

    def _rate(self, key: int, mode: str, least: int | None = None) -> float | None:
        """A mode's measured speed (tokens a row per target step's time) over the band's
        latest `window` rounds, once it has `warmup` (or `least`) rounds there."""
        since = self._begun.get(key, 0) - self.window
        times = [(t, s) for index, t, s in self._measured.get((key, mode), ()) if index > since]
        seconds = sum(s for _, s in times)
        if len(times) < (self.warmup if least is None else least) or seconds <= 0:
            return None
        return sum(t for t, _ in times) / seconds

    def record(self) -> dict[str, Any]:
        """The plan's settings and its live tallies, as results.json records them."""
        return {
            "prior_alpha": self.acceptance.prior,
            "window": self.window,
            "margin": self.arms.margin,
            "warmup": self.warmup,
            "probe_every": self.arms.probe_every,
            "weight": self.acceptance.weight,
            "rounds_by_rows_and_mode": self.rounds,
            "speed_by_rows_and_mode": self.speed,
        }
