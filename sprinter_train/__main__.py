"""Entry point: python -m sprinter_train stage=<name> [hydra overrides].

Every stage is a module with `run(cfg) -> dict`; the registry below is the whole CLI. Settings
are checked before dispatch (a bad one writes nothing), and an interrupted stage exits
128 + signal (143 for SIGTERM, 130 for SIGINT) saying what it completed, never 0.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from sprinter_train.core.compile_cache import compile_counters, compile_record, dynamo_seconds
from sprinter_train.core.config import register_methods
from sprinter_train.core.interrupt import StageInterrupted, interruptible
from sprinter_train.stages import STAGES
from sprinter_train.stages.settings import settle, validate_config

log = logging.getLogger("sprinter_train")
register_methods()  # before Hydra composes: cfg.methods holds every conf/methods/*.yaml


def run_stage(cfg: DictConfig) -> dict[str, Any]:
    """Check the settings, then dispatch to the stage module; an unknown stage fails with the
    list of valid ones, a signal raises StageInterrupted naming what the stage completed. A
    stage that compiled reports it (`compile` in its result: seconds, cache hits, folder).
    The compile cache (`decoding.compile_cache`) is part of a compiled runner's layout: the
    builder points torch at it when it builds the runner (`decoding.builder`), as for any
    other caller."""
    name = None if OmegaConf.is_missing(cfg, "stage") else cfg.stage
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; choose one of: {', '.join(STAGES)}")
    validate_config(cfg)
    settle(cfg)  # switches as the bools they mean (`no` is False), for every stage alike
    counters, seconds = compile_counters(), dynamo_seconds()
    with interruptible(f"stage={name}"):
        result = importlib.import_module(STAGES[name]).run(cfg)
    record = compile_record(counters, dynamo_seconds() - seconds)
    if record["cache_hits"] or record["cache_misses"]:  # a stage that compiled says so
        log.info(
            "stage=%s compiled for %.1f s: %d of %d graphs from the compile cache %s",
            name,
            record["seconds"],
            record["cache_hits"],
            record["cache_hits"] + record["cache_misses"],
            record["cache_folder"],
        )
        if isinstance(result, dict):
            result = {**result, "compile": record}
    return result


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict[str, Any]:
    try:
        result = run_stage(cfg)
    except StageInterrupted as stop:
        log.error(stop.report())
        sys.exit(stop.exit_code)
    print(json.dumps(result, indent=2, default=str))
    return result


if __name__ == "__main__":
    sys.exit(main())
