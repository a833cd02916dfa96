"""How settings are checked before any work: one clear error naming the key and its range.

Unchecked, out-of-range settings run on and produce something: top_p=0 dies deep in sampling,
top_p=2 is silently 1, train.lam=0 exports a constant verifier with exit 0, a negative
data.max_prompt_tokens slices the first tokens off every prompt. Each package that owns a
section checks it (a function of the section's plain dict, returning one line per problem);
`stages.settings` runs them all in the entry point before a stage is dispatched, so a bad
setting writes nothing. This module holds only the mechanism.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig

SectionCheck = Callable[[dict[str, Any]], list[str]]  # a section -> its problems


class ConfigError(ValueError):
    """A setting out of its range; the message names the key and the range."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def check(
    problems: list[str], key: str, value: Any, ok: Callable[[float], bool], allowed: str
) -> None:
    """Add a line to `problems` unless `value` is a number `ok` accepts."""
    number = _number(value)
    if number is None or not ok(number):
        problems.append(f"{key}={value!r} is out of range: {allowed}")


def check_whole(problems: list[str], key: str, value: Any, low: int, note: str = "") -> None:
    """Add a line to `problems` unless `value` is a whole number >= `low` (`note` follows the
    range in the line)."""
    check(problems, key, value, lambda n: whole(n) and n >= low, f"a whole number >= {low}{note}")


def positive_finite(x: float) -> bool:
    return math.isfinite(x) and x > 0


def whole(x: float) -> bool:
    return math.isfinite(x) and x == int(x)


def section(cfg: DictConfig | Mapping[str, Any], name: str) -> dict[str, Any]:
    """One top-level section as a plain dict, interpolations resolved ({} when absent).
    omegaconf is imported here, not above: the export folder carries the check helpers (the
    sampling and label checks use them) and installs no omegaconf."""
    from omegaconf import DictConfig, OmegaConf

    found = cfg.get(name)
    if isinstance(found, DictConfig):
        return OmegaConf.to_container(found, resolve=True)  # type: ignore[return-value]
    return dict(found or {})


def problems_in(
    cfg: DictConfig | Mapping[str, Any], checks: Mapping[str, SectionCheck]
) -> list[str]:
    """Every problem the section checks find in `cfg`, in the order of `checks`."""
    return [line for name, of in checks.items() for line in of(section(cfg, name))]


def raise_problems(problems: list[str]) -> None:
    """Raise ConfigError listing every problem; nothing has been written yet."""
    if problems:
        raise ConfigError("invalid settings (nothing was run):\n  " + "\n  ".join(problems))


def prompt_room(contexts: Mapping[str, int | None], reserve: int, setting: str) -> int | None:
    """Longest prompt that leaves `reserve` positions (what `setting` generates) in every
    model's context (role -> max positions; None: unbounded); stop when a model cannot hold
    even one prompt token beside the reserve."""
    known = {role: int(n) for role, n in contexts.items() if n}
    if not known:
        return None
    role, smallest = min(known.items(), key=lambda item: item[1])
    if smallest <= reserve:
        raise ConfigError(
            f"the {role} model's context holds {smallest} positions, but {setting} reserves "
            f"{reserve} of them for generated tokens: no room for a prompt. Lower {setting} "
            f"below {smallest} or use a model with a longer context."
        )
    return smallest - reserve
