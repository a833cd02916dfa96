"""A verifier sidecar is checked by train's declarations when it is read (issue 52, items 2
and 6): stage=bench, stage=export and stage=evaluate refuse one holding settings stage=train
would refuse, or naming a feature no one declared, naming the file and stage=train, before
any model loads."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from sprinter_train.__main__ import run_stage
from sprinter_train.core.io import CorruptInputError
from sprinter_train.verifier.checkpoint import load_verifier, save_verifier, verifier_path
from tests.synthetic import write_synthetic_records

D = 8
STAGES = {
    "bench": ("stage=bench", "bench.methods=[sprinter]"),
    "export": ("stage=export", "export.method=sprinter"),
    "evaluate": ("stage=evaluate", "evaluate.lams=[1.2]"),
}
SCALARS = ["run_position", "accept_so_far"]


@pytest.fixture
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any model load fails the test: the sidecar must be refused before one."""

    def loaded(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model loaded before the verifier's sidecar was checked")

    monkeypatch.setattr("sprinter_train.bench.run.prepare.load_roles", loaded)
    monkeypatch.setattr("sprinter_train.stages.export.load_role", loaded)


def stage_with_verifier(
    compose_cfg, tmp_path: Path, stage: str, features: dict[str, Any]
) -> tuple[Any, Path]:
    """The stage's config and the sidecar of the verifier-lam1.2 it reads, written by
    save_verifier with these `features` (records beside it, which evaluate reads first)."""
    cfg = compose_cfg(f"checkpoints_root={tmp_path / 'ck'}", *STAGES[stage])
    write_synthetic_records(Path(cfg.experiment_dir), rows=64, d=D, shard_rows=64)
    width = D + len(features["names"]) - 1  # the hidden state, then one column per scalar
    meta = {"lam": 1.2, "hidden_layer": -1, "features": {**features, "d_in": width}}
    path = verifier_path(cfg.checkpoint_dir, 1.2)
    save_verifier(path, torch.ones(width), torch.zeros(1), meta)
    return cfg, path.with_suffix(".json")


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_sidecars_out_of_range_settings_are_refused(
    compose_cfg, tmp_path, no_model_loads, stage
) -> None:
    """accept_n0 = -4 and run_position_cap = -3, which train.feature_settings refuses: the
    bench ran sprinter on them (accept_so_far divides by zero at four drafts) and export
    shipped them. Each is named with the schema's range, the file and stage=train."""
    settings = {"run_position_cap": -3.0, "accept_prior": 0.5, "accept_n0": -4.0}
    features = {"names": ["hidden", *SCALARS], "settings": settings}
    cfg, sidecar = stage_with_verifier(compose_cfg, tmp_path, stage, features)
    with pytest.raises(CorruptInputError) as refused:
        run_stage(cfg)
    message = str(refused.value)
    assert message.startswith(f"{sidecar}: ")
    assert "features.settings.accept_n0=-4 is out of range: a finite number > 0" in message
    assert "features.settings.run_position_cap=-3 is out of range: an integer >= 0" in message
    assert re.search(r"stage=train .*train\.lam=1\.2", message)
    assert not list(Path(cfg.checkpoint_dir).glob("export-*"))


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_sidecar_naming_an_unknown_feature_is_refused_naming_the_file(
    compose_cfg, tmp_path, no_model_loads, stage
) -> None:
    """An unknown feature failed after the models, latency profile and alpha, with `train.features
    must list some of ...`: a setting the user never touched. Now the sidecar is named."""
    settings = {"run_position_cap": 16.0, "accept_prior": 0.5, "accept_n0": 4.0}
    features = {"names": ["hidden", "run_position", "draft_mood"], "settings": settings}
    cfg, sidecar = stage_with_verifier(compose_cfg, tmp_path, stage, features)
    with pytest.raises(CorruptInputError, match=re.escape(f"{sidecar}: features.names[2]=")):
        run_stage(cfg)


def test_a_trained_sidecars_whole_settings_read_as_floats_still_load(tmp_path) -> None:
    """The sidecar stores every setting as a float (run_position_cap 16.0): a whole one is
    whole; one a feature needs but the sidecar lacks is named."""
    meta = {"lam": 1.0, "features": {"names": ["hidden", *SCALARS], "d_in": D + 2}}
    meta["features"]["settings"] = {"run_position_cap": 16.0, "accept_prior": 0.5, "accept_n0": 4.0}
    path = save_verifier(verifier_path(tmp_path, 1.0), torch.ones(D + 2), torch.zeros(1), meta)
    assert load_verifier(path).spec.setting("run_position_cap") == 16.0
    del meta["features"]["settings"]["accept_n0"]
    save_verifier(path, torch.ones(D + 2), torch.zeros(1), meta)
    with pytest.raises(CorruptInputError, match="features.settings.accept_n0 is missing"):
        load_verifier(path)
