"""Every section's settings check, run by the entry point before a stage is dispatched.

Each check lives with the package that owns its section; this is the one place that knows
them all (core.validation holds the mechanism).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from sprinter_train.bench.methods import bench_problems, method_problems
from sprinter_train.core.sampling import sampling_problems
from sprinter_train.core.validation import SectionCheck, problems_in, raise_problems
from sprinter_train.data.prompts import data_problems
from sprinter_train.decoding.engine import decoding_problems
from sprinter_train.harvest.driver import harvest_problems
from sprinter_train.verifier.labels import lam_problems, train_problems

CHECKS: dict[str, SectionCheck] = {
    "sampling": sampling_problems,
    "train": train_problems,
    "data": data_problems,
    "harvest": harvest_problems,
    "decoding": decoding_problems,
    "bench": bench_problems,
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


def config_problems(cfg: DictConfig | Mapping[str, Any]) -> list[str]:
    """Every out-of-range setting of `cfg`, one line each (empty when all are fine)."""
    return [
        *experiment_problems(cfg),
        *problems_in(cfg, CHECKS),
        *method_problems(cfg),
        *lam_problems(cfg),
    ]


def validate_config(cfg: DictConfig | Mapping[str, Any]) -> None:
    """Raise ConfigError listing every out-of-range setting; nothing has been written yet."""
    raise_problems(config_problems(cfg))
