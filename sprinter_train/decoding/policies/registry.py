"""The methods the engine runs, as their configs name them, with the traits their classes
declare.

A method is a `Method` subclass (decoding/policies/) and a conf/methods/<name>.yaml whose
`_target_` names the class; composing the config finds every yaml (core/config.py), so adding
a method touches no list anywhere. Everything that needs to know a method's nature (whether
it is lossless, what it needs at run time, whether the bench computes its law, whether it
exports, which rivals it must beat, how evaluate scores its rule) asks here.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterable, Mapping
from typing import Any

from sprinter_train.decoding.policies.base import Method, Traits


class MethodError(ValueError):
    """A method config whose class cannot be found or declares no (or incomplete) traits."""


def method_class(node: Mapping[str, Any], name: str = "?") -> type[Method]:
    """The class a method config's `_target_` names."""
    target = node.get("_target_") if hasattr(node, "get") else None
    if not isinstance(target, str) or "." not in target:
        raise MethodError(f"methods.{name} has no `_target_` naming its policy class")
    module, _, attribute = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as err:
        raise MethodError(f"methods.{name}._target_={target}: {err}") from err
    if not isinstance(cls, type) or not issubclass(cls, Method):
        raise MethodError(
            f"methods.{name}._target_={target} is not a Method "
            "(sprinter_train.decoding.policies.base.Method)"
        )
    return cls


def traits_of(node: Mapping[str, Any], name: str = "?") -> Traits:
    """The traits a method's class declares; refuses a class that declares none."""
    cls = method_class(node, name)
    traits = cls.__dict__.get("traits")
    if not isinstance(traits, Traits):
        fields = ", ".join(f.name for f in dataclasses.fields(Traits))
        raise MethodError(
            f"methods.{name}: {cls.__module__}.{cls.__qualname__} declares no traits: give it "
            f"`traits: ClassVar[Traits] = Traits(...)` with every field ({fields})"
        )
    if traits.law_computed and cls.first_draft_keeps is Method.first_draft_keeps:
        raise MethodError(
            f"methods.{name}: {cls.__qualname__}'s traits say law_computed but it defines no "
            "first_draft_keeps (the rule's first draft the bench's exact law reads)"
        )
    return traits


def all_traits(methods: Mapping[str, Any]) -> dict[str, Traits]:
    """Every configured method's traits by name (`cfg.methods`)."""
    return {name: traits_of(node, name) for name, node in methods.items()}


def with_trait(
    methods: Mapping[str, Any], names: Iterable[str] | None = None, **wanted
) -> list[str]:
    """The methods (of `names`, else all configured) whose traits have the wanted values,
    e.g. `with_trait(cfg.methods, lossless=True)`; a trait that is a set or tuple matches
    when it contains the wanted value (`needs="verifier"`)."""
    chosen = list(methods) if names is None else [n for n in names if n in methods]
    found = []
    for name in chosen:
        traits = traits_of(methods[name], name)
        if all(_matches(getattr(traits, key), value) for key, value in wanted.items()):
            found.append(name)
    return found


def greedy_exact(methods: Mapping[str, Any], without: Iterable[str] = ()) -> list[str]:
    """The methods other than target_only that emit the target's greedy tokens at T = 0 and
    need none of `without` (e.g. no trained verifier): what a greedy bench compares."""
    barred = set(without)
    return [
        name
        for name, traits in all_traits(methods).items()
        if name != "target_only" and traits.greedy_exact and not traits.needs & barred
    ]


def _matches(trait: Any, value: Any) -> bool:
    if isinstance(trait, frozenset | tuple) and not isinstance(value, frozenset | tuple):
        return value in trait
    return trait == value


def as_record(traits: Traits) -> dict[str, Any]:
    """The traits as results.json records them (the record score by name)."""
    return {
        "lossless": traits.lossless,
        "greedy_exact": traits.greedy_exact,
        "needs": sorted(traits.needs),
        "law_computed": traits.law_computed,
        "exports": traits.exports,
        "rivals": list(traits.rivals),
        "record_score": None if traits.record_score is None else traits.record_score.name,
    }
