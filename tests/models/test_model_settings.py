"""Settings that relate to a model are checked from its config before a model loads, and a
complete record set outlives a rerun that fails (trust issue #52, item 5).

`harvest.hidden_layer=99` passed the schema, loaded every model, removed the finished record
set's manifest to redo it and died with `IndexError: tuple index out of range`: train,
tables and bench then failed on that set until it was harvested again.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from sprinter_train.__main__ import run_stage
from sprinter_train.core.validation import ConfigError
from sprinter_train.harvest import driver
from sprinter_train.harvest.reader import open_records
from sprinter_train.models.roles import model_specs
from sprinter_train.models.shapes import model_shape
from sprinter_train.models.tiny import build_tiny_model, build_tiny_tokenizer
from sprinter_train.stages.model_settings import distill_model_problems, harvest_model_problems
from sprinter_train.verifier.checkpoint import save_verifier, verifier_path
from tests.distill_helpers import TINY_DISTILL
from tests.harvest_helpers import compose_at


def no_load(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a model loaded before the settings were checked")


@pytest.fixture(scope="module")
def harvested(tmp_path_factory) -> Path:
    """A finished tiny harvest (two prompts, one shard)."""
    root = tmp_path_factory.mktemp("settings")
    assert run_stage(compose_at(root, "data.num_prompts=2"))["shards_written"] == 1
    return root


@pytest.fixture
def records(harvested: Path, tmp_path: Path) -> Path:
    """A copy of the finished harvest's records, where its config puts them."""
    records_dir = Path(compose_at(tmp_path).experiment_dir) / "records"
    shutil.copytree(Path(compose_at(harvested).experiment_dir) / "records", records_dir)
    return records_dir


def snapshot(records_dir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(records_dir.iterdir())}


def test_a_hidden_layer_the_draft_lacks_is_refused_before_a_model_loads(
    records: Path, tmp_path: Path, monkeypatch
) -> None:
    """The tiny draft has one layer: hidden_states 0..1. Layer 99 is refused naming the key
    and the draft's range; nothing loads and the complete record set is left as it was."""
    before = snapshot(records)
    monkeypatch.setattr(driver, "load_roles", no_load)
    cfg = compose_at(tmp_path, "data.num_prompts=2", "harvest.hidden_layer=99")
    with pytest.raises(ConfigError, match=r"harvest\.hidden_layer=99 is out of range") as error:
        run_stage(cfg)
    assert "-1 (the last, normed state) or 0..1" in str(error.value)
    assert snapshot(records) == before
    assert len(open_records(cfg.experiment_dir).frame) > 0


def test_a_rerun_that_fails_before_its_first_rewrite_keeps_the_record_set_whole(
    records: Path, tmp_path: Path, monkeypatch
) -> None:
    """Another (valid) config redoes every shard; a run that fails before it rewrites the
    first one leaves the manifest, so the finished set still reads."""
    frame = open_records(records.parent).frame

    def fails(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("failed before any shard was rewritten")

    monkeypatch.setattr(driver, "harvest_prompts", fails)
    cfg = compose_at(tmp_path, "data.num_prompts=2", "harvest.hidden_layer=0")
    with pytest.raises(RuntimeError, match="before any shard"):
        run_stage(cfg)
    assert (records / "manifest.json").exists()
    pd.testing.assert_frame_equal(open_records(cfg.experiment_dir).frame, frame)


def test_the_drafts_last_hidden_state_is_in_range_and_one_past_it_is_not(
    compose_cfg, tmp_path: Path
) -> None:
    """Read from a saved draft folder's config.json: three layers take -1 and 0..3."""
    folder = tmp_path / "draft"
    build_tiny_model(
        {"num_hidden_layers": 3, "head_vocab_size": 64, "embed_rank": 8}
    ).save_pretrained(folder)
    build_tiny_tokenizer().save_pretrained(folder)
    models = ("models=tiny_random", f"models.draft.path={folder}")
    for layer, refused in ((-1, False), (0, False), (3, False), (4, True)):
        cfg = compose_cfg("stage=harvest", *models, f"harvest.hidden_layer={layer}")
        assert bool(harvest_model_problems(cfg)) == refused, layer


def test_the_offline_targets_gguf_is_read_for_its_shape_without_loading_it(compose_cfg) -> None:
    """From the GGUF's header alone (transformers' GGUF config reads the same 30 layers of
    width 576, in seconds)."""
    shape = model_shape(model_specs(compose_cfg("stage=distill").models), "target")
    assert (shape.layers, shape.width) == (30, 576)


def test_init_layers_past_the_targets_layers_are_refused_before_the_teacher_loads(
    compose_cfg, tmp_path: Path, monkeypatch
) -> None:
    """The tiny target has three layers (0..2): a student copying layer 3 failed only after
    the corpus and the teacher were built."""
    monkeypatch.setattr("sprinter_train.stages.distill.load_role", no_load)
    work = tmp_path / "work"
    cfg = compose_cfg(
        "stage=distill",
        *TINY_DISTILL,
        f"distill.work_dir={work}",
        "distill.student.init_layers=[0,3]",
    )
    with pytest.raises(ConfigError, match=r"distill\.student\.init_layers=\[0, 3\] is out"):
        run_stage(cfg)
    assert not work.exists()


def test_a_students_widths_must_fit_the_target(compose_cfg) -> None:
    """The tiny target is 64 wide: an embedding rank past the student's width, or a PCA
    student wider than the target, cannot be built from it."""

    def problems(*overrides: str) -> list[str]:
        return distill_model_problems(compose_cfg("stage=distill", *TINY_DISTILL, *overrides))

    assert problems() == []
    assert problems("distill.student.embed_rank=64") == []
    (rank,) = problems("distill.student.embed_rank=65")
    assert rank.startswith("distill.student.embed_rank=65 is out of range")
    pca = ("distill.student.init=pca", "distill.student.embed_rank=16")
    assert problems(*pca, "distill.student.hidden_size=64") == []
    (wide,) = problems(*pca, "distill.student.hidden_size=96")
    assert wide.startswith("distill.student.hidden_size=96 is out of range")


def test_a_verifier_reading_a_layer_the_bench_draft_lacks_is_refused_before_a_model_loads(
    compose_cfg, tmp_path: Path, monkeypatch
) -> None:
    """A verifier trained on records of a deeper draft's layer 5, benched with the tiny
    one-layer draft: the draft's runner could not hand it that layer."""
    monkeypatch.setattr("sprinter_train.bench.run.prepare.load_roles", no_load)
    cfg = compose_cfg(
        f"checkpoints_root={tmp_path / 'ck'}",
        "stage=bench",
        "models=tiny_random",
        "bench.methods=[sprinter]",
    )
    meta = {"lam": 1.2, "hidden_layer": 5, "features": {"names": ["hidden"], "d_in": 8}}
    save_verifier(verifier_path(cfg.checkpoint_dir, 1.2), torch.ones(8), torch.zeros(1), meta)
    with pytest.raises(ConfigError, match="read its hidden layer 5"):
        run_stage(cfg)
