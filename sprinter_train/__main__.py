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

from sprinter_train.stages import STAGES

log = logging.getLogger("sprinter_train")


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
