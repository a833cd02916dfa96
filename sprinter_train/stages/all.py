"""stage=all: harvest -> train (every λ in train.lams, or train.lam, then the soft-label
verifier: train.all_labels) -> tables -> evaluate -> bench.

The steps are `all_steps` in conf/config.yaml, run in this pipeline order.

python -m sprinter_train stage=all experiment=<exp> [data.num_prompts=N]
python -m sprinter_train stage=all experiment=<exp> 'all_steps=[harvest,train,tables,evaluate]'

Each step is the stage itself, called in this process with the same config; a step that has
nothing to do (a complete harvest) returns at once. `tables` is skipped when the records
have no companion (evaluate then reports no SV table, bench skips sv).
"""

from __future__ import annotations

import copy
import importlib
import logging
import time
from typing import Any

from omegaconf import DictConfig, open_dict

from sprinter_train.core.interrupt import note_completed
from sprinter_train.harvest.reader import open_records
from sprinter_train.stages import STAGES
from sprinter_train.verifier.labels import LABELS

log = logging.getLogger(__name__)


def _stage(name: str, cfg: DictConfig) -> dict[str, Any]:
    module = STAGES.get(name)
    if module is None or name == "all":
        raise ValueError(f"stage=all cannot run stage={name}")
    start = time.perf_counter()
    log.info("stage=all: running stage=%s", name)
    result = importlib.import_module(module).run(cfg)
    result["seconds"] = time.perf_counter() - start
    note_completed(f"stage={name}", f"stage={name}")
    return result


PIPELINE = ("harvest", "train", "tables", "evaluate", "bench")  # the order; conf picks the steps


def steps_of(cfg: DictConfig) -> list[str]:
    """`all_steps` (conf/config.yaml) in pipeline order; unknown names are an error, not a
    silent skip, and so is an empty list."""
    asked = [str(s) for s in cfg.all_steps]
    unknown = sorted(set(asked) - set(PIPELINE))
    if unknown or not asked:
        problem = f"unknown step(s) {unknown}" if unknown else "no step"
        raise ValueError(f"all_steps: {problem}; choose from {list(PIPELINE)}")
    return [s for s in PIPELINE if s in asked]


def labels_of(cfg: DictConfig) -> list[str]:
    """train.all_labels, checked before the first step runs: known kinds, none twice, not
    empty when the train step runs."""
    asked = [str(label) for label in cfg.train.get("all_labels") or []]
    problems = []
    if unknown := sorted(set(asked) - set(LABELS)):
        problems.append(f"unknown label(s) {unknown}")
    if not asked:
        problems.append("no label")
    if len(set(asked)) != len(asked):
        problems.append("a label named twice")
    if problems:
        raise ValueError(
            f"train.all_labels={asked}: {', '.join(problems)}; choose from {list(LABELS)}"
        )
    return asked


def run(cfg: DictConfig) -> dict[str, Any]:
    steps = steps_of(cfg)
    if "train" in steps:
        labels_of(cfg)
    start = time.perf_counter()
    results: dict[str, Any] = {}
    if "harvest" in steps:
        results["harvest"] = _stage("harvest", cfg)
    if "train" in steps:
        results["train"] = train_labels(cfg)
    if "tables" in steps:
        results["tables"] = tables_if_companion(cfg)
    for name in ("evaluate", "bench"):
        if name in steps:
            results[name] = _stage(name, cfg)
    results["seconds"] = time.perf_counter() - start
    log.info("stage=all: %s in %.0f s", " -> ".join(steps), results["seconds"])
    return results


def with_label(cfg: DictConfig, label: str) -> DictConfig:
    """A copy of cfg with train.label set (the caller's cfg is left as it was)."""
    out = copy.deepcopy(cfg)
    with open_dict(out):
        out.train.label = label
    return out


def train_labels(cfg: DictConfig) -> dict[str, Any]:
    """stage=train once per label of train.all_labels: ratio trains every λ of train.lams (or
    train.lam), accept_prob the soft-label verifier, after the λ sweep so that evaluate shows
    it beside them. Each verifier's result carries its stage run's wall time as
    `stage_seconds`."""
    if str(cfg.train.get("label") or "ratio") != "ratio":
        log.warning(
            "stage=all trains train.all_labels=%s; train.label=%s is stage=train's setting",
            list(cfg.train.all_labels),
            cfg.train.label,
        )
    results: dict[str, Any] = {}
    for label in labels_of(cfg):
        trained = _stage("train", with_label(cfg, label))
        seconds = trained.pop("seconds")
        results.update({n: {**r, "stage_seconds": seconds} for n, r in trained.items()})
    return results


def tables_if_companion(cfg: DictConfig) -> dict[str, Any]:
    if open_records(cfg.experiment_dir, columns=["S"], stage="stage=all").has_companion:
        return _stage("tables", cfg)
    log.warning("stage=all: the records have no companion (S, A): skipping stage=tables")
    return {"skipped": "records without a companion"}
