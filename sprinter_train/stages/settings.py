"""Every section's settings check, run by the entry point before a stage is dispatched.

What each key holds (type, range, integer-ness, a non-empty list) is declared in
stages/schema.py and checked by core.schema; the hand checks of relations between keys live
with the packages that own their sections, and this is the one place that knows them all.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from functools import partial
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from sprinter_train.bench.run.methods import method_problems
from sprinter_train.core.schema import ANY, Lookup, Switch, leaves, unknown
from sprinter_train.core.schema import problems as schema_problems
from sprinter_train.core.validation import SectionCheck, problems_in, raise_problems
from sprinter_train.decoding.builder import decoding_problems
from sprinter_train.harvest.driver import harvest_problems
from sprinter_train.stages.schema import FREE, METHODS, schema
from sprinter_train.verifier.labels import lam_problems

CHECKS: dict[str, SectionCheck] = {
    "harvest": harvest_problems,
    "decoding": decoding_problems,
}


def experiment_problems(cfg: DictConfig | Mapping[str, Any]) -> list[str]:
    """An experiment name must name a folder of its own under artifacts/ and checkpoints/:
    empty, `.`/`..` or a path would write into (or beside) the root."""
    name = str(cfg.get("experiment") or "")
    if not name.strip() or name in (".", "..") or "/" in name or "\\" in name:
        return [
            f"experiment={name!r} is out of range: a non-empty folder name without path "
            "separators (artifacts/<experiment>/)"
        ]
    return []


def resolved(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """`cfg` as a plain dict, interpolations resolved (what the schema checks)."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    return dict(cfg)


def declared_problems(cfg: DictConfig | Mapping[str, Any]) -> list[str]:
    """Every setting its declaration (stages/schema.py) refuses, one line each, and every key
    declared nowhere (a `++`-added typo would otherwise be ignored)."""
    tree, declared = resolved(cfg), schema()
    known = partial(method_parameter, tree)
    return unknown(tree, declared, FREE, known) + schema_problems(tree, declared)


def method_parameter(tree: Mapping[str, Any], key: str) -> bool:
    """Whether `key` (methods.<m>.<k>...) is a parameter of method m's class: a method is its
    class and its config node, and the class's signature declares the node's keys (instantiate
    passes them), so a new method's own parameters need no entry in stages/schema.py. An entry
    whose keys the schema declares for every method (`verifier`, `planner`, ...) stays the
    schema's to check."""
    parts = key.split(".")
    node = (tree.get("methods") or {}).get(parts[1]) if parts[0] == "methods" else None
    if len(parts) < 3 or not isinstance(node, Mapping) or not node.get("_target_"):
        return False
    try:
        parameters = inspect.signature(get_class(str(node["_target_"]))).parameters
    except (ImportError, ValueError, TypeError, AttributeError):
        return False  # method_problems names a target that does not load
    nested = any(p.startswith(f"{ANY}.{parts[2]}.") for p in METHODS)
    return parts[2] in parameters and (len(parts) == 3 or not nested)


def settle(cfg: DictConfig) -> DictConfig:
    """`cfg` with every true/false switch written as the bool it means (`no`, `off`, `0` are
    False): stages read switches with `bool(...)`, which reads `'no'` as True. Call after
    validate_config, which refuses a word that is neither."""
    lookup = Lookup(schema())
    for key, value in leaves(resolved(cfg)):
        spec = lookup(key)
        if isinstance(spec, Switch) and (read := spec.read(value)) is not value:
            OmegaConf.update(cfg, key, read, merge=False)
    return cfg


def _key(line: str) -> str:
    """The setting a problem line names (its leading dotted key, without an index)."""
    found = re.match(r"[A-Za-z_][\w.]*", line)
    return found.group() if found else line


def config_problems(cfg: DictConfig | Mapping[str, Any]) -> list[str]:
    """Every out-of-range setting of `cfg`, one line each (empty when all are fine): the hand
    checks (relations between keys, and the ranges their packages word best), then each
    declared key's type and range (stages/schema.py) the hand checks did not already name."""
    declared = declared_problems(cfg)
    by_hand: list[str] = []
    for of in (
        experiment_problems,
        lambda c: problems_in(c, CHECKS),
        method_problems,
        lam_problems,
    ):
        try:
            by_hand += of(cfg)
        except (TypeError, ValueError, IndexError, KeyError, AttributeError):
            if not declared:
                raise
            # a hand check read a value of a type its declaration already refused
    named = {_key(line) for line in by_hand}
    return [*by_hand, *(line for line in declared if _key(line) not in named)]


def validate_config(cfg: DictConfig | Mapping[str, Any]) -> None:
    """Raise ConfigError listing every out-of-range setting; nothing has been written yet."""
    raise_problems(config_problems(cfg))
