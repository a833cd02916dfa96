"""Compose the project's Hydra config outside the CLI (tests, benchmarks, notebooks)."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def compose_config(*overrides: str) -> DictConfig:
    """conf/config.yaml with these overrides, as `python -m sprinter_train` would see it."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()
