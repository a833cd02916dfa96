"""stage=all: harvest -> train (every λ in train.lams) -> tables -> evaluate -> bench.

python -m sprinter_train stage=all experiment=<exp> [data.num_prompts=N]

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

from sprinter_train.recordset import open_records

log = logging.getLogger(__name__)


def _stage(name: str, cfg: DictConfig) -> dict[str, Any]:
    from sprinter_train.__main__ import STAGES

    module = STAGES.get(name)
    if module is None or name == "all":
        raise ValueError(f"stage=all cannot run stage={name}")
    start = time.perf_counter()
    log.info("stage=all: running stage=%s", name)
    result = importlib.import_module(module).run(cfg)
    result["seconds"] = time.perf_counter() - start
    return result


def run(cfg: DictConfig) -> dict[str, Any]:
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))  # our copy to edit
    results: dict[str, Any] = {"harvest": _stage("harvest", cfg)}
    results["train"] = {}
    for lam in list(cfg.train.lams):
        with open_dict(cfg):
            cfg.train.lam = float(lam)
        trained = _stage("train", cfg)
        seconds = trained.pop("seconds")
        for name, result in trained.items():
            results["train"][name] = {**result, "stage_seconds": seconds}
    with open_dict(cfg):
        cfg.train.lam = None
    if open_records(cfg.experiment_dir, columns=["S"], stage="stage=all").has_companion:
        results["tables"] = _stage("tables", cfg)
    else:
        log.warning("stage=all: the records have no companion (S, A): skipping stage=tables")
        results["tables"] = {"skipped": "records without a companion"}
    results["evaluate"] = _stage("evaluate", cfg)
    results["bench"] = _stage("bench", cfg)
    return results
