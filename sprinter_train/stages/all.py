"""stage=all: harvest -> train (every λ in train.lams) -> tables -> evaluate -> bench.

python -m sprinter_train stage=all experiment=<exp> [data.num_prompts=N]
python -m sprinter_train stage=all experiment=<exp> 'all_steps=[harvest,train,tables,evaluate]'

Each step is the stage itself, called in this process with the same config; a step that has
nothing to do (a complete harvest) returns at once. `tables` is skipped when the records
have no companion (evaluate then reports no SV table, bench skips sv).
"""

from __future__ import annotations

import importlib
import logging
import time
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from sprinter_train.harvest.reader import open_records
from sprinter_train.stages import STAGES

log = logging.getLogger(__name__)


def _stage(name: str, cfg: DictConfig) -> dict[str, Any]:
    module = STAGES.get(name)
    if module is None or name == "all":
        raise ValueError(f"stage=all cannot run stage={name}")
    start = time.perf_counter()
    log.info("stage=all: running stage=%s", name)
    result = importlib.import_module(module).run(cfg)
    result["seconds"] = time.perf_counter() - start
    return result


STEPS = ("harvest", "train", "tables", "evaluate", "bench")


def steps_of(cfg: DictConfig) -> list[str]:
    """`all_steps` in pipeline order; unknown names are an error, not a silent skip."""
    asked = [str(s) for s in cfg.get("all_steps") or STEPS]
    unknown = sorted(set(asked) - set(STEPS))
    if unknown:
        raise ValueError(f"all_steps: unknown step(s) {unknown}; choose from {list(STEPS)}")
    return [s for s in STEPS if s in asked]


def run(cfg: DictConfig) -> dict[str, Any]:
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))  # our copy to edit
    steps = steps_of(cfg)
    start = time.perf_counter()
    results: dict[str, Any] = {}
    if "harvest" in steps:
        results["harvest"] = _stage("harvest", cfg)
    if "train" in steps:
        results["train"] = train_every_lambda(cfg)
    if "tables" in steps:
        results["tables"] = tables_if_companion(cfg)
    for name in ("evaluate", "bench"):
        if name in steps:
            results[name] = _stage(name, cfg)
    results["seconds"] = time.perf_counter() - start
    log.info("stage=all: %s in %.0f s", " -> ".join(steps), results["seconds"])
    return results


def train_every_lambda(cfg: DictConfig) -> dict[str, Any]:
    trained_all: dict[str, Any] = {}
    for lam in list(cfg.train.lams):
        with open_dict(cfg):
            cfg.train.lam = float(lam)
        trained = _stage("train", cfg)
        seconds = trained.pop("seconds")
        for name, result in trained.items():
            trained_all[name] = {**result, "stage_seconds": seconds}
    with open_dict(cfg):
        cfg.train.lam = None
    return trained_all


def tables_if_companion(cfg: DictConfig) -> dict[str, Any]:
    if open_records(cfg.experiment_dir, columns=["S"], stage="stage=all").has_companion:
        return _stage("tables", cfg)
    log.warning("stage=all: the records have no companion (S, A): skipping stage=tables")
    return {"skipped": "records without a companion"}
