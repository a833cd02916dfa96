"""Compose the project's Hydra config outside the CLI (tests, benchmarks, notebooks)."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
METHOD_SET = "method_set"  # config.yaml's defaults take `method_set: all`


def register_methods(conf_dir: Path = CONF_DIR) -> list[str]:
    """Every conf/methods/<name>.yaml as `cfg.methods.<name>`, found by its file: Hydra's
    defaults cannot glob a folder, and a list of methods in config.yaml would be one more
    place to edit for a new method. Returns the names registered."""
    paths = sorted((conf_dir / "methods").glob("*.yaml"))
    methods = {path.stem: OmegaConf.load(path) for path in paths}
    ConfigStore.instance().store(
        group=METHOD_SET, name="all", node={"methods": methods}, package="_global_"
    )
    return list(methods)


def conf_defaults(file: str, section: str) -> dict:
    """A section of one conf/ file as written there (`conf_defaults("bench/default.yaml",
    "guard")`): where code needs a setting's default for input that lacks it (an older
    results.json), it reads conf/'s, so a default is written in one place."""
    node = OmegaConf.load(CONF_DIR / file)
    return OmegaConf.to_container(node[section], resolve=False)  # type: ignore[return-value]


def compose_config(*overrides: str) -> DictConfig:
    """conf/config.yaml with these overrides, as `python -m sprinter_train` would see it."""
    register_methods()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()
