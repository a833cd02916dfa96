"""Play the arm that measured best: how sd's gamma (gamma_plan.py) and sv's drafting mode
(companion_plan.py) are chosen before each round, each a configuration of `ArmSelector`.

An arm is one way to play a round (a number of drafts a row, a drafting mode); its value is
what the caller measured or estimated of it (goodput, speed). Per key (a number of live rows,
a band of them) the selector keeps the arm it played unless another is ahead by more than
`margin`: medians of noisy timings must not make it flap. An arm's value is only refreshed
when it is played, so one slow reading could park the selector on an arm whose rivals it
never measures again: every `probe_every` rounds at a key it plays another arm for
`probe_rounds` rounds (a probe, tallied as such), the best rival or each rival in turn.
An arm with no value yet is played before any comparison (warm-up).

Every choice is fixed before the round it plays, from earlier rounds only, so a method that
is lossless for every arm stays lossless whichever arm plays.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

RIVALS = ("best", "turn")  # which arm a probe plays: the best rival, or each rival in turn


class ArmSelector:
    """Chooses an arm per key from the values the caller measured; tallies rounds per key."""

    def __init__(
        self,
        name: str,
        arms: Sequence[Hashable],
        margin: float,
        probe_every: int,
        rival: str,
        probe_rounds: int = 1,
        label: Callable[[Any], str] = str,
    ) -> None:
        if margin < 0 or probe_every < 0 or probe_rounds < 1 or rival not in RIVALS:
            raise ValueError(
                f"{name}: margin {margin} and probe_every {probe_every} must be >= 0, "
                f"probe_rounds {probe_rounds} >= 1 and rival one of {RIVALS} (not {rival!r})"
            )
        self.arms = tuple(arms)
        self.margin, self.probe_every, self.rival = margin, probe_every, rival
        self.probe_rounds = probe_rounds
        self.label = label  # key -> its name in `rounds`
        self.current: dict[Any, Any] = {}  # key -> the arm kept there (probes aside)
        self._since_probe: dict[Any, int] = {}
        self._probes: dict[Any, int] = {}  # probes played per key (whose turn is next)
        self._probing: dict[Any, tuple[Any, int]] = {}  # key -> (probed arm, rounds left)
        self.rounds: dict[str, dict[str, int]] = {}  # label(key) -> arm -> rounds played

    def choose(self, key: Any, values: Sequence[float | None] | None, start: Any = None) -> Any:
        """The arm to play next at `key`. values[i] is arms[i]'s (None: not measured yet, so
        it warms up: the first such arm plays); `values` None: no arm can be valued yet, and
        the kept arm (else `start`) plays. A key's first comparison keeps `start` unless
        another arm is ahead by the margin; without a `start` it takes the best."""
        probe = False
        if key in self._probing:  # a probe's later round
            played, left = self._probing.pop(key)
            if left > 1:
                self._probing[key] = (played, left - 1)
            probe = True
        elif values is None:
            played = self.current.setdefault(key, start)
        elif None in values:
            played = self.arms[list(values).index(None)]
        else:
            played, probe = self._compare(key, values, start)  # type: ignore[arg-type]
        tally = self.rounds.setdefault(self.label(key), {})
        name = f"{played} (probe)" if probe else str(played)
        tally[name] = tally.get(name, 0) + 1
        return played

    def _compare(self, key: Any, values: Sequence[float], start: Any) -> tuple[Any, bool]:
        """Keep or switch the key's arm by the margin; a probe when one is due."""
        best = _highest(values, range(len(self.arms)))
        current = self.current.get(key, start)
        if current is None or values[best] > values[self.arms.index(current)] * (1 + self.margin):
            current = self.arms[best]
        self.current[key] = played = current
        probe = False
        since = self._since_probe.get(key, 0) + 1
        if self.probe_every and since >= self.probe_every and len(self.arms) > 1:
            played, probe, since = self._rival(key, current, values), True, 0
            if self.probe_rounds > 1:
                self._probing[key] = (played, self.probe_rounds - 1)
        self._since_probe[key] = since
        return played, probe

    def _rival(self, key: Any, current: Any, values: Sequence[float]) -> Any:
        others = [i for i, arm in enumerate(self.arms) if arm != current]
        if self.rival == "best":
            return self.arms[_highest(values, others)]
        turn = self._probes.get(key, 0)
        self._probes[key] = turn + 1
        return self.arms[others[turn % len(others)]]


def _highest(values: Sequence[float], among: Sequence[int] | range) -> int:
    """The index (of `among`) of the highest value, the first of equals."""
    return max(among, key=lambda i: (values[i], -i))
