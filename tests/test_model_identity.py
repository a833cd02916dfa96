"""A local model's identity: its weights, config and code, never its card."""

from __future__ import annotations

import os

from sprinter_train.harvest.manifest import _local_signature


def test_a_card_edit_keeps_the_identity_and_a_weights_edit_changes_it(tmp_path) -> None:
    folder = tmp_path / "draft"
    folder.mkdir()
    for name, text in {"model.safetensors": "w", "config.json": "{}", "README.md": "card"}.items():
        (folder / name).write_text(text)
    spec = {"path": str(folder)}
    before = _local_signature(spec)
    (folder / "README.md").write_text("card with draft_eval figures")
    (folder / "training_curve.png").write_bytes(b"png")
    assert _local_signature(spec) == before
    (folder / "model.safetensors").write_text("retrained weights")
    os.utime(folder / "model.safetensors", (1, 1))
    assert _local_signature(spec) != before
