"""A verifier sidecar checked, when it is read, by the declarations of the settings that wrote
it: train.features, train.feature_settings.* and train.mlp.hidden are declared here, and
stages/schema.py's TRAIN takes them from here (the verifier sits below the stages).

stage=train refuses `train.feature_settings.accept_n0=-4` before any work, but a sidecar
edited by hand, or written by another version, reached the decoder unchecked: the bench ran
sprinter on it (accept_so_far divides by zero at four drafts) and stage=export shipped it,
and an unknown feature name failed only after the models had loaded, naming
`train.features`, a setting the user never touched. Reading through here refuses such a
sidecar at once, naming its file and the stage=train that rewrites it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sprinter_train.core.io import CorruptInputError
from sprinter_train.core.schema import Seq, Spec, Word, positive, problems, share, whole
from sprinter_train.decoding.features.table import FEATURES, feature_order

HEADS = ("linear", "mlp")
FEATURE_NAMES = Seq(unique=True)  # train.features; a sidecar's must be declared features
MLP_HIDDEN = whole(1)  # train.mlp.hidden
FEATURE_SETTINGS: dict[str, Spec] = {  # train.feature_settings.<key>, features.settings.<key>
    "run_position_cap": whole(0, note="train's default is bench.gamma_max; 0 holds it at 0"),
    "accept_prior": share(),
    "accept_n0": positive(note="the prior's weight in drafts: 0 divides by 0"),
}


def declarations() -> dict[str, Spec]:
    """Each sidecar key with the spec of the train setting it was written from; a feature
    name must be one the table declares (read at call time: a registered feature counts)."""
    specs: dict[str, Spec] = {
        "features.names": dataclasses.replace(FEATURE_NAMES, item=Word(feature_order())),
        "head": Word(HEADS),
        "mlp.hidden": MLP_HIDDEN,
    }
    specs.update({f"features.settings.{key}": spec for key, spec in FEATURE_SETTINGS.items()})
    return specs


def as_written(value: Any) -> Any:
    """A setting as train.feature_settings held it: the sidecar stores every setting as a
    float (FeatureSpec.settings), so a whole one (run_position_cap 16.0) is an int again."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def sidecar_problems(meta: Mapping[str, Any]) -> list[str]:
    """One line per sidecar value its declaration refuses, and per setting a listed feature
    needs that the sidecar lacks. A sidecar without `features` (from before them) reads as
    before: only the keys it holds are checked."""
    tree: dict[str, Any] = {k: meta[k] for k in ("head", "mlp") if k in meta}
    features = meta.get("features")
    found: list[str] = []
    if isinstance(features, Mapping):
        settings = features.get("settings") or {}
        if not isinstance(settings, Mapping):
            found.append(f"features.settings={settings!r} is not a mapping of setting values")
            settings = {}
        tree["features"] = {
            "names": features.get("names"),
            "settings": {key: as_written(value) for key, value in settings.items()},
        }
        names = features.get("names")
        listed = [n for n in names if n in FEATURES] if isinstance(names, list) else []
        for name in listed:
            for key in FEATURES[name].settings:
                if settings.get(key) is None:
                    found.append(
                        f"features.settings.{key} is missing: feature {name} needs it "
                        f"(train.feature_settings.{key})"
                    )
    return problems(tree, declarations()) + sorted(set(found), key=found.index)


def check_sidecar(meta: Mapping[str, Any], sidecar: Path, remedy: str) -> None:
    """Refuse a sidecar `sidecar_problems` finds fault with, naming the file and `remedy`
    (the stage=train that rewrites it)."""
    found = sidecar_problems(meta)
    if found:
        raise CorruptInputError(f"{sidecar}: {'; '.join(found)}; {remedy}")
