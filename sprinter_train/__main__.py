"""Entry point: python -m sprinter_train stage=<name> [hydra overrides].

Every stage is a module with `run(cfg) -> dict`; the registry below is the whole CLI.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from typing import Any

import hydra
from omegaconf import DictConfig

log = logging.getLogger("sprinter_train")

# stage name -> module with run(cfg)
STAGES: dict[str, str] = {
    "harvest": "sprinter_train.stages.harvest",
    "train": "sprinter_train.stages.train",
    "tables": "sprinter_train.stages.tables",
    "evaluate": "sprinter_train.stages.evaluate",
    "bench": "sprinter_train.stages.bench",
    "distill": "sprinter_train.stages.distill",
    "draft_eval": "sprinter_train.stages.draft_eval",
    "all": "sprinter_train.stages.all",
}


def run_stage(cfg: DictConfig) -> dict[str, Any]:
    """Dispatch to the stage module; an unknown stage fails with the list of valid ones."""
    name = cfg.stage
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; choose one of: {', '.join(STAGES)}")
    return importlib.import_module(STAGES[name]).run(cfg)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict[str, Any]:
    result = run_stage(cfg)
    print(json.dumps(result, indent=2, default=str))
    return result


if __name__ == "__main__":
    sys.exit(main())
