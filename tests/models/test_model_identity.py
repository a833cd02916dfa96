"""A model's identity: its weights' and config's bytes, never their mtimes or its card; a
tiny model's config and seed; and every reader comparing all of it (issue 24, item 12)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from sprinter_train.bench.run.methods import VerifierMismatchError, plan_methods
from sprinter_train.harvest.manifest import _local_signature, model_identity
from sprinter_train.models import identity
from sprinter_train.models.loading import LoadedModel, _gguf_cache_dir
from sprinter_train.models.tiny import build_tiny_model, build_tiny_tokenizer
from sprinter_train.verifier.checkpoint import save_verifier, verifier_path


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def model_folder(root: Path) -> Path:
    folder = root / "draft"
    folder.mkdir(parents=True)
    for name, text in {"model.safetensors": "w", "config.json": "{}", "README.md": "card"}.items():
        (folder / name).write_text(text)
    return folder


def test_a_card_edit_keeps_the_identity_and_a_weights_edit_changes_it(tmp_path) -> None:
    folder = model_folder(tmp_path)
    spec = {"path": str(folder)}
    before = _local_signature(spec)
    (folder / "README.md").write_text("card with draft_eval figures")
    (folder / "training_curve.png").write_bytes(b"png")
    assert _local_signature(spec) == before
    (folder / "model.safetensors").write_text("retrained weights")
    os.utime(folder / "model.safetensors", (1, 1))
    assert _local_signature(spec) != before


def test_a_touched_or_copied_model_keeps_its_identity(tmp_path) -> None:
    """A fresh clone, checkout or `cp -r` gives byte-identical files new mtimes: the old
    size-and-mtime signature changed, so the bench refused every verifier."""
    folder = model_folder(tmp_path)
    before = _local_signature({"path": str(folder)})
    for f in folder.iterdir():
        os.utime(f, (1e9, 1e9))
    assert _local_signature({"path": str(folder)}) == before
    copy = shutil.copytree(folder, tmp_path / "clone" / "draft")
    assert _local_signature({"path": str(copy)}) == before


def test_a_files_digest_is_cached_and_a_touch_only_rehashes(tmp_path, monkeypatch) -> None:
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"x" * 1000)
    calls: list[Path] = []
    real = identity.file_sha256
    monkeypatch.setattr(identity, "file_sha256", lambda p: calls.append(p) or real(p))
    first = identity.file_digest(weights)
    assert identity.file_digest(weights) == first and len(calls) == 1
    os.utime(weights, (1e9, 1e9))
    assert identity.file_digest(weights) == first and len(calls) == 2


def test_the_dequantised_gguf_cache_survives_a_touch(tmp_path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"gguf bytes")
    before = _gguf_cache_dir(gguf, str(tmp_path / "gguf"))
    os.utime(gguf, (1e9, 1e9))
    assert _gguf_cache_dir(gguf, str(tmp_path / "gguf")) == before
    gguf.write_bytes(b"other bytes")
    assert _gguf_cache_dir(gguf, str(tmp_path / "gguf")) != before


def tiny(seed: int) -> LoadedModel:
    spec = {"path": "tiny_random", "seed": seed, "config": {"num_hidden_layers": 1}}
    model = build_tiny_model(spec["config"], seed=seed)
    return LoadedModel("draft", model, build_tiny_tokenizer(), spec)


def test_a_verifier_of_another_tiny_seed_is_refused_naming_the_field(compose_cfg, tmp_path):
    """Tiny drafts were identified by their path string: a verifier trained on the seed-2
    draft ran with a seed-5 one."""
    cfg = compose_cfg(f"checkpoints_root={tmp_path / 'ck'}", "bench.methods=[sprinter]")
    trained, ran = tiny(2), tiny(5)
    d = int(trained.model.config.hidden_size)
    meta = {
        "lam": 1.2,
        "features": {"names": ["hidden"], "d_in": d},
        "draft_model": "tiny_random",
        "draft_identity": model_identity(trained),
    }
    path = save_verifier(
        verifier_path(cfg.checkpoint_dir, 1.2), torch.ones(d), torch.zeros(1), meta
    )
    same = plan_methods(cfg, 2, trained.model, False, draft_identity=model_identity(trained))
    assert "sprinter" in same.policies
    with pytest.raises(VerifierMismatchError, match=f"{path.name}.*draft built.*seed.*stage=train"):
        plan_methods(cfg, 2, ran.model, False, draft_identity=model_identity(ran))
