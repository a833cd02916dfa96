"""Every yaml in conf/ composes, every method instantiates, and the stage registry is the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from sprinter_train.__main__ import run_stage
from sprinter_train.bench.run.methods import runtime_entries

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUP_OPTIONS = [
    (group.name, option.stem)
    for group in sorted(CONF.iterdir())
    if group.is_dir() and group.name != "methods"  # every method is composed at once, below
    for option in sorted(group.glob("*.yaml"))
]
METHODS = sorted(path.stem for path in (CONF / "methods").glob("*.yaml"))
RUNTIME_STUBS = {  # what the bench passes for the entries a config cannot hold
    "gamma": 2,
    "planner": object(),
    "verifier": lambda engine, batch, rnd, step: 0.5,
    "table": object(),
    "companion_plan": object(),
}


def test_conf_has_groups() -> None:
    assert {g for g, _ in GROUP_OPTIONS} >= {"models", "data", "distill", "draft_eval", "logger"}


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS)
def test_every_config_composes(compose_cfg, group: str, option: str) -> None:
    cfg = compose_cfg("stage=draft_eval", f"{group}={option}")
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["stage"] == "draft_eval"
    assert group in resolved


def test_every_method_yaml_is_composed_into_cfg_methods(compose_cfg) -> None:
    cfg = compose_cfg("stage=bench")
    assert sorted(cfg.methods) == METHODS
    assert set(METHODS) <= set(cfg.bench.methods)  # the default bench runs every method


@pytest.mark.parametrize("name", METHODS)
def test_every_method_config_instantiates(compose_cfg, name: str) -> None:
    """Each method's parameters are its policy's: instantiate passes every key but the ones
    the bench fills in at run time, which it names."""
    node = compose_cfg("stage=bench").methods[name]
    stubs = {key: RUNTIME_STUBS[key] for key in runtime_entries(node)}
    policy = instantiate(node, **stubs)
    assert policy.name == name
    for key, value in stubs.items():
        assert getattr(policy, key) is value


@pytest.mark.parametrize(
    "path", sorted(CONF.rglob("*.yaml")), ids=lambda p: str(p.relative_to(CONF))
)
def test_every_yaml_opens_with_its_command(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and ("python -m sprinter_train" in first or "pytest" in first)


def test_unknown_stage_lists_the_valid_ones(compose_cfg) -> None:
    with pytest.raises(ValueError, match="distill"):
        run_stage(compose_cfg("stage=nonsense"))
