"""Settings declared by type and range, checked by code generated from the declaration.

Hand-kept lists of keys to check drifted from the configs: `bench.max_new_tokens=1e3`,
`bench.methods=[]`, `bench.latency.reps=0` and a negative `train.feature_settings.accept_n0`
each passed and failed after the models had loaded. A key is declared once, with what it
holds (`Num`: a number, whole or not, its range and the words it also takes; `Seq`: a list,
empty or not, of items of one spec; `Word`: one of some words), and `problems` checks every
declared key a config holds. `unknown` names every key a config holds that no spec declares,
with the closest declared key: the entry point refuses it, and a test refuses a new conf key
until it is declared.

Plain dicts only: the config is converted (interpolations resolved) before it reaches here.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterator, Mapping
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


@dataclass(frozen=True)
class Switch:
    """True or false in any form Hydra or YAML means it (`yes`/`no`, `on`/`off`, `1`/`0`,
    any case): `bool('no')` is True, so a word read by hand turned checks on against the
    user's word. `words` are the other values it takes (auto); `null` admits None.
    `read` gives the bool a stage sees (settings.settle writes it back into the config)."""

    words: tuple[str, ...] = ()
    null: bool = False
    note: str = ""

    def read(self, value: Any) -> Any:
        """The value as a stage should see it: a bool, one of `words`, or None; raises
        ValueError for anything else."""
        if isinstance(value, bool) or (value is None and self.null):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            if value in self.words:
                return value
            if value.strip().lower() in TRUE_WORDS | FALSE_WORDS:
                return value.strip().lower() in TRUE_WORDS
        raise ValueError(value)

    def allowed(self) -> str:
        extra = [*self.words, *(["null"] if self.null else [])]
        text = "true or false (also yes/no, on/off, 1/0)"
        text += f", or {' or '.join(extra)}" if extra else ""
        return text + (f" ({self.note})" if self.note else "")

    def problems(self, key: str, value: Any) -> list[str]:
        try:
            self.read(value)
        except ValueError:
            return [f"{key}={value!r} is out of range: {self.allowed()}"]
        return []


TRUE_WORDS = frozenset({"true", "yes", "on", "1"})
FALSE_WORDS = frozenset({"false", "no", "off", "0"})


@dataclass(frozen=True)
class Text:
    """A free string (a path, a hub name, a field name): checked where it is used, declared
    here so that a misspelt key is refused; `null` admits None."""

    null: bool = False
    note: str = ""

    def problems(self, key: str, value: Any) -> list[str]:
        if isinstance(value, str) or (value is None and self.null):
            return []
        kind = "a string" + (" or null" if self.null else "")
        return [
            f"{key}={value!r} is out of range: {kind}" + (f" ({self.note})" if self.note else "")
        ]


Spec = Num | Word | Seq | Switch | Text


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
    return Lookup(schema)(key)


class Lookup:
    """spec_of for many keys of one schema: the patterns split once (a config's check looks
    up every leaf, and the schema test checks hundreds of configs)."""

    def __init__(self, schema: Mapping[str, Spec]) -> None:
        self.schema = schema
        self.patterns = [(p.split("."), spec) for p, spec in schema.items() if ANY in p]

    def __call__(self, key: str) -> Spec | None:
        if key in self.schema:
            return self.schema[key]
        got = key.split(".")
        return next(
            (
                spec
                for want, spec in self.patterns
                if len(want) == len(got)
                and all(w in (ANY, g) for w, g in zip(want, got, strict=True))
            ),
            None,
        )


def problems(tree: Mapping[str, Any], schema: Mapping[str, Spec]) -> list[str]:
    """One line per declared key of `tree` (a resolved config) its spec refuses; a key whose
    spec names an `unless` key holding a value is not read, so not checked."""
    values, lookup = dict(leaves(tree)), Lookup(schema)
    return [
        line
        for key, value in values.items()
        if (spec := lookup(key)) is not None
        and (getattr(spec, "unless", None) is None or values.get(spec.unless) is None)  # type: ignore[union-attr]
        for line in spec.problems(key, value)
    ]


def unknown(
    tree: Mapping[str, Any],
    schema: Mapping[str, Spec],
    free: tuple[str, ...] = (),
    known: Callable[[str], bool] = lambda key: False,
) -> list[str]:
    """One line per key of `tree` no spec declares (of any type: a `++`-added key with a
    typo was otherwise ignored), naming the closest declared key; `known` admits keys
    declared elsewhere (a method's parameters, by its class)."""
    names, lookup = list(schema), Lookup(schema)
    found = []
    for key, _ in leaves(tree):
        if lookup(key) is not None or any(_under(p, key) for p in free) or known(key):
            continue
        close = difflib.get_close_matches(key, [_fill(p, key) for p in names], n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        found.append(f"{key} is not a setting: no such key in conf/{hint}")
    return found


def _fill(pattern: str, key: str) -> str:
    """`pattern` with its ANY segments taken from `key` where it has them (methods.*.gamma
    read beside methods.sd.gama is methods.sd.gamma)."""
    got = key.split(".")
    return ".".join(
        got[i] if seg == ANY and i < len(got) else seg for i, seg in enumerate(pattern.split("."))
    )


def _under(pattern: str, key: str) -> bool:
    """Whether `key` is `pattern` or lies below it."""
    depth = len(pattern.split("."))
    return matches(pattern, ".".join(key.split(".")[:depth]))
