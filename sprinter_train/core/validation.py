"""Settings checked before any work: one clear error naming the key and its allowed range.

Out-of-range settings used to run on and produce something: top_p=0 died deep in sampling,
top_p=2 was silently 1, train.lam=0 exported a constant verifier with exit 0, a negative
data.max_prompt_tokens sliced the first tokens off every prompt. `validate_config` runs in
the entry point before a stage is dispatched, so a bad setting writes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

VERIFIER_LABELS = ("ratio", "accept_prob")  # verifier/labels.py LABELS (core cannot import it)


class ConfigError(ValueError):
    """A setting out of its range; the message names the key and the range."""


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _check(
    problems: list[str], key: str, value: Any, ok: Callable[[float], bool], allowed: str
) -> None:
    number = _number(value)
    if number is None or not ok(number):
        problems.append(f"{key}={value!r} is out of range: {allowed}")


def _positive_finite(x: float) -> bool:
    return math.isfinite(x) and x > 0


def _whole(x: float) -> bool:
    return math.isfinite(x) and x == int(x)


def _section(cfg: DictConfig | Mapping[str, Any], name: str) -> dict[str, Any]:
    """One top-level section as a plain dict, interpolations resolved ({} when absent)."""
    section = cfg.get(name)
    if isinstance(section, DictConfig):
        return OmegaConf.to_container(section, resolve=True)  # type: ignore[return-value]
    return dict(section or {})


def config_problems(cfg: DictConfig | Mapping[str, Any]) -> list[str]:
    """Every out-of-range setting of `cfg`, one line each (empty when all are fine)."""
    problems: list[str] = []
    sampling = _section(cfg, "sampling")
    if "temperature" in sampling:
        _check(
            problems,
            "sampling.temperature",
            sampling["temperature"],
            lambda t: math.isfinite(t) and t >= 0,
            "a finite number >= 0 (0 is greedy)",
        )
    if "top_p" in sampling:
        _check(
            problems, "sampling.top_p", sampling["top_p"], lambda p: 0 < p <= 1, "0 < top_p <= 1"
        )
    if sampling.get("top_k") is not None:
        _check(
            problems,
            "sampling.top_k",
            sampling["top_k"],
            lambda k: _whole(k) and k >= 0,
            "a whole number >= 0 (0: no top-k)",
        )
    train = _section(cfg, "train")
    if train.get("lam") is not None:
        _check(problems, "train.lam", train["lam"], _positive_finite, "a finite number > 0")
    elif "lams" in train:
        lams = train["lams"]
        if not isinstance(lams, list | tuple) or not lams:
            problems.append(
                f"train.lams={lams!r} is out of range: a non-empty list of finite numbers > 0 "
                "(or set train.lam)"
            )
        else:
            for i, lam in enumerate(lams):
                _check(problems, f"train.lams[{i}]", lam, _positive_finite, "a finite number > 0")
    if (train.get("label") or "ratio") not in VERIFIER_LABELS:  # null: ratio, as before labels
        problems.append(
            f"train.label={train['label']!r} is out of range: ratio (q/p <= λ) or accept_prob "
            "(soft min(1, p/q), no λ)"
        )
    data = _section(cfg, "data")
    if data.get("max_prompt_tokens") is not None:
        _check(
            problems,
            "data.max_prompt_tokens",
            data["max_prompt_tokens"],
            lambda n: _whole(n) and n >= 0,
            "a whole number >= 0 (0 or null: no limit)",
        )
    harvest = _section(cfg, "harvest")
    for key in ("batch_size", "generation_batch_size", "statistics_rows"):
        if key in harvest:
            _check(
                problems,
                f"harvest.{key}",
                harvest[key],
                lambda n: _whole(n) and n >= 1,
                "a whole number >= 1",
            )
    return problems


def validate_config(cfg: DictConfig | Mapping[str, Any]) -> None:
    """Raise ConfigError listing every out-of-range setting; nothing has been written yet."""
    problems = config_problems(cfg)
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
