"""Settings declared by type and range, checked by code generated from the declaration.

Hand-kept lists of keys to check drifted from the configs: `bench.max_new_tokens=1e3`,
`bench.methods=[]`, `bench.latency.reps=0` and a negative `train.feature_settings.accept_n0`
each passed and failed after the models had loaded. A key is declared once, with what it
holds (`Num`: a number, whole or not, its range and the words it also takes; `Seq`: a list,
empty or not, of items of one spec; `Word`: one of some words), and `problems` checks every
declared key a config holds. `undeclared` names the numeric and list keys a config holds
that no spec declares, so a test refuses a new key until it is declared.

Plain dicts only: the config is converted (interpolations resolved) before it reaches here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

ANY = "*"  # a key segment that matches every key at its level (methods.*.max_gamma)


@dataclass(frozen=True)
class Num:
    """A number: `whole` refuses a float (1e3 is 1000.0, which no slice takes) and a bool;
    `low`/`high` bound it (`above`: low itself is refused); `null` admits None and `words`
    admit those strings (auto). NaN and infinities are always refused."""

    low: float | None = None
    high: float | None = None
    whole: bool = False
    above: bool = False
    null: bool = False
    words: tuple[str, ...] = ()
    note: str = ""

    def allowed(self) -> str:
        kind = "an integer" if self.whole else "a finite number"
        bounds = []
        if self.low is not None:
            bounds.append(f"{'>' if self.above else '>='} {self.low:g}")
        if self.high is not None:
            bounds.append(f"<= {self.high:g}")
        extra = [*self.words, *(["null"] if self.null else [])]
        text = f"{kind} {' and '.join(bounds)}".strip()
        if extra:
            text += f", or {' or '.join(extra)}"
        return text + (f" ({self.note})" if self.note else "")

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.null
        if isinstance(value, str):
            return value in self.words
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.whole and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.above else value < self.low):
            return False
        return self.high is None or value <= self.high

    def problems(self, key: str, value: Any) -> list[str]:
        if self.accepts(value):
            return []
        return [f"{key}={value!r} is out of range: {self.allowed()}"]


@dataclass(frozen=True)
class Word:
    """One of `words` (a string setting whose choices are known before any work)."""

    words: tuple[str, ...]
    null: bool = False

    def problems(self, key: str, value: Any) -> list[str]:
        if (value is None and self.null) or (isinstance(value, str) and value in self.words):
            return []
        return [f"{key}={value!r} is out of range: one of {', '.join(self.words)}"]


@dataclass(frozen=True)
class Seq:
    """A list of items each `item` accepts (None: any item); `empty` admits [] and `null`
    None. `unique` refuses an item named twice."""

    item: Num | Word | None = None
    empty: bool = False
    null: bool = False
    unique: bool = False
    size: int | None = None  # exactly this many items (a [low, high] pair: 2)
    unless: str | None = None  # a dotted key whose non-null value leaves this one unread
    note: str = ""

    def problems(self, key: str, value: Any) -> list[str]:
        if value is None and self.null:
            return []
        if not isinstance(value, list | tuple):
            return [f"{key}={value!r} is out of range: a list{self._about()}"]
        if not value and not self.empty:
            return [f"{key}=[] is out of range: a non-empty list{self._about()}"]
        if self.size is not None and len(value) != self.size:
            return [f"{key}={list(value)!r} is out of range: {self.size} items{self._about()}"]
        found = [line for i, v in enumerate(value) for line in self._item(f"{key}[{i}]", v)]
        if self.unique:
            twice = sorted({str(v) for v in value if list(value).count(v) > 1})
            if twice:
                found.append(f"{key} names {', '.join(twice)} more than once: name each once")
        return found

    def _item(self, key: str, value: Any) -> list[str]:
        return [] if self.item is None else self.item.problems(key, value)

    def _about(self) -> str:
        of = f" of {self.item.allowed()}" if isinstance(self.item, Num) else ""
        return of + (f" ({self.note})" if self.note else "")


Spec = Num | Word | Seq


def whole(low: int = 1, **kw: Any) -> Num:
    """An integer >= `low` (a count: 1; a seed or an optional count: 0)."""
    return Num(low=low, whole=True, **kw)


def positive(**kw: Any) -> Num:
    """A finite number > 0."""
    return Num(low=0, above=True, **kw)


def share(**kw: Any) -> Num:
    """A number in [0, 1]."""
    return Num(low=0, high=1, **kw)


def matches(pattern: str, key: str) -> bool:
    """Whether the dotted `key` fits `pattern`, whose ANY segments match any one segment."""
    want, got = pattern.split("."), key.split(".")
    return len(want) == len(got) and all(w in (ANY, g) for w, g in zip(want, got, strict=True))


def leaves(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every (dotted key, value) of a nested dict; a list is a leaf."""
    if isinstance(tree, Mapping):
        for name, value in tree.items():
            yield from leaves(value, f"{prefix}.{name}" if prefix else str(name))
    else:
        yield prefix, tree


def spec_of(schema: Mapping[str, Spec], key: str) -> Spec | None:
    """The spec declared for `key`: its own entry, else the first pattern it fits."""
    if key in schema:
        return schema[key]
    return next(
        (spec for pattern, spec in schema.items() if ANY in pattern and matches(pattern, key)),
        None,
    )


def problems(tree: Mapping[str, Any], schema: Mapping[str, Spec]) -> list[str]:
    """One line per declared key of `tree` (a resolved config) its spec refuses; a key whose
    spec names an `unless` key holding a value is not read, so not checked."""
    values = dict(leaves(tree))
    return [
        line
        for key, value in values.items()
        if (spec := spec_of(schema, key)) is not None
        and (getattr(spec, "unless", None) is None or values.get(spec.unless) is None)  # type: ignore[union-attr]
        for line in spec.problems(key, value)
    ]


def undeclared(
    tree: Mapping[str, Any], schema: Mapping[str, Spec], free: tuple[str, ...] = ()
) -> list[str]:
    """The keys of `tree` holding a number or a list that no spec of `schema` declares (`free`:
    patterns of keys passed through unchecked, such as a model's own config)."""
    return [
        key
        for key, value in leaves(tree)
        if isinstance(value, int | float | list) and not isinstance(value, bool)
        if spec_of(schema, key) is None and not any(_under(p, key) for p in free)
    ]


def _under(pattern: str, key: str) -> bool:
    """Whether `key` is `pattern` or lies below it."""
    depth = len(pattern.split("."))
    return matches(pattern, ".".join(key.split(".")[:depth]))
