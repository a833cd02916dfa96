"""The settings of each stage that relate to a model, checked from the models' configs in the
stage's entry point, before any model loads and before the stage touches what an earlier run
wrote.

stages.settings checks every key against its declared range before dispatch, but a range
that depends on the model (how many layers the draft has) needs the model's config, and a
stage may run on models that are not there yet when the config is composed (stage=all
harvests before it benches). Unchecked, `harvest.hidden_layer=99` loaded every model,
removed a complete record set's manifest to redo it and died with `IndexError: tuple index
out of range`; a student's `init_layers` past the target's layers failed only after the
corpus and the teacher were built. The bench's verifiers' layer is checked where the bench
reads their sidecars, before its models load (bench/run/prepare.py).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from sprinter_train.core.validation import raise_problems, section
from sprinter_train.models.roles import model_specs
from sprinter_train.models.shapes import ModelShape, hidden_layer_fits, model_shape


def harvest_model_problems(cfg: DictConfig) -> list[str]:
    """harvest.hidden_layer indexes the draft's hidden states (harvest/records.py reads the
    draft's body at that layer): one the draft lacks is refused."""
    layer = section(cfg, "harvest").get("hidden_layer", -1)
    draft = model_shape(model_specs(cfg.models), "draft")
    if hidden_layer_fits(int(layer), draft):
        return []
    return [
        f"harvest.hidden_layer={layer} is out of range for {draft.describe()}: "
        f"{draft.hidden_layers()}"
    ]


def distill_model_problems(cfg: DictConfig) -> list[str]:
    """A new student copies the target layers `init_layers` (init=target_layers) or keeps
    `hidden_size` of the target's principal directions (init=pca), and factorises its
    embedding at `embed_rank` of its width: each must fit the target (models/student_init.py)."""
    student: dict[str, Any] = section(cfg, "distill").get("student") or {}
    target = model_shape(model_specs(cfg.models), "target")
    init = student.get("init", "target_layers")
    problems: list[str] = []
    width = target.width
    if init == "target_layers":
        problems += _init_layer_problems(list(student.get("init_layers") or []), target)
    elif init == "pca":
        width = int(student["hidden_size"])
        if target.width is not None and width > target.width:
            problems.append(
                f"distill.student.hidden_size={width} is out of range for "
                f"{target.describe()}: at most its width {target.width} (init=pca keeps that "
                "many of its principal directions)"
            )
            width = target.width
    rank = student.get("embed_rank")
    if rank and width is not None and int(rank) > width:
        problems.append(
            f"distill.student.embed_rank={rank} is out of range: at most the student's width "
            f"{width} (its embedding is factorised through that rank)"
        )
    return problems


def _init_layer_problems(layers: list[Any], target: ModelShape) -> list[str]:
    if target.layers is None:
        return []
    missing = [int(i) for i in layers if not 0 <= int(i) < target.layers]
    if not missing:
        return []
    return [
        f"distill.student.init_layers={layers} is out of range for {target.describe()}: "
        f"target layers 0..{target.layers - 1} (it has no layer {missing[0]})"
    ]


CHECKS = {
    "harvest": harvest_model_problems,
    "distill": distill_model_problems,
}


def check_model_settings(cfg: DictConfig, stage: str) -> None:
    """Raise ConfigError listing `stage`'s settings its models cannot take; nothing loaded
    or written yet."""
    raise_problems(CHECKS[stage](cfg))
