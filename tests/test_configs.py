"""Every yaml in conf/ composes, and the stage registry is the whole CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sprinter_train.__main__ import run_stage

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUP_OPTIONS = [
    (group.name, option.stem)
    for group in sorted(CONF.iterdir())
    if group.is_dir()
    for option in sorted(group.glob("*.yaml"))
]


def test_conf_has_groups() -> None:
    assert {g for g, _ in GROUP_OPTIONS} >= {"models", "data", "distill", "draft_eval", "logger"}


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS)
def test_every_config_composes(compose_cfg, group: str, option: str) -> None:
    cfg = compose_cfg("stage=draft_eval", f"{group}={option}")
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["stage"] == "draft_eval"
    assert group in resolved


@pytest.mark.parametrize(
    "path", sorted(CONF.rglob("*.yaml")), ids=lambda p: str(p.relative_to(CONF))
)
def test_every_yaml_opens_with_its_command(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and ("python -m sprinter_train" in first or "pytest" in first)


def test_unknown_stage_lists_the_valid_ones(compose_cfg) -> None:
    with pytest.raises(ValueError, match="distill"):
        run_stage(compose_cfg("stage=nonsense"))
