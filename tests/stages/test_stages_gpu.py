"""Stages on CUDA with tiny models (skipped without a GPU): the paths the CPU suite cannot
reach, each of which once failed on a first H100 run (a CPU tensor beside CUDA ones)."""

from __future__ import annotations

import json

import pytest
import torch

from sprinter_train.__main__ import run_stage
from sprinter_train.core.config import compose_config
from sprinter_train.verifier.features import FeatureSpec, assemble

pytestmark = pytest.mark.gpu


def test_scalar_only_verifier_features_stay_on_the_device() -> None:
    spec = FeatureSpec(("q", "draft_entropy"))
    parts = {"q": torch.rand(3, device="cuda"), "draft_entropy": torch.rand(3, device="cuda")}
    rows = assemble(spec, parts).batch()
    assert rows.device.type == "cuda" and rows.shape == (3, 2)


def test_a_new_student_distils_on_cuda(tmp_path) -> None:
    out = tmp_path / "draft"
    cfg = compose_config(
        f"artifacts_root={tmp_path}",
        "stage=distill",
        "device=cuda",
        "models=tiny_random",
        "experiment=gpu_distill",
        f"distill.output_dir={out}",
        "distill.max_minutes=5",
        "distill.max_tokens=4096",  # four visits of a 16 x 64 shard
        "distill.eval_every_shards=2",
        "distill.corpus.seq_len=64",
        "distill.corpus.shard_sequences=16",
        "distill.corpus.max_tokens=20000",
        "distill.corpus.source=mix",
        "distill.corpus.generated.max_tokens=8000",
        "distill.corpus.generated.block_prompts=16",
        "distill.corpus.generated.max_new_tokens=32",
        "distill.student.head_vocab=64",
        "distill.student.embed_rank=16",
        "distill.loss.top1_weight=0.5",
    )
    run_stage(cfg)
    state = json.loads((out / "training_state.json").read_text())["state"]
    assert state["tokens"] == 4096 and any("heldout_alpha_t1" in p for p in state["curve"])
