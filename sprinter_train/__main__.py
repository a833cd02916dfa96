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

# stage name -> module with run(cfg); None means planned but not built yet
STAGES: dict[str, str | None] = {
    "harvest": "sprinter_train.stages.harvest",
    "train": "sprinter_train.stages.train",
    "tables": "sprinter_train.stages.tables",
    "evaluate": "sprinter_train.stages.evaluate",
    "bench": None,
    "distill": "sprinter_train.stages.distill",
    "draft_eval": "sprinter_train.stages.draft_eval",
    "all": "sprinter_train.stages.all",
}


class StageNotImplementedError(NotImplementedError):
    """A registered stage whose implementation has not landed yet."""


def run_stage(cfg: DictConfig) -> dict[str, Any]:
    """Dispatch to the stage module; unknown or unbuilt stages fail loudly, never fake a result."""
    name = cfg.stage
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; choose one of: {', '.join(STAGES)}")
    module = STAGES[name]
    if module is None:
        raise StageNotImplementedError(
            f"stage={name} is not implemented yet (see the open issues); built stages: "
            + ", ".join(s for s, m in STAGES.items() if m)
        )
    return importlib.import_module(module).run(cfg)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict[str, Any]:
    result = run_stage(cfg)
    print(json.dumps(result, indent=2, default=str))
    return result


if __name__ == "__main__":
    sys.exit(main())
