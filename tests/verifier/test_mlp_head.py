"""train.head=mlp: it trains on synthetic records, round-trips through save/load, scores alike
in training, evaluate and the decoder's scorer, and stage=export refuses it by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from sprinter_train.__main__ import run_stage
from sprinter_train.evaluation.scores import verifier_logits
from sprinter_train.harvest.reader import open_records
from sprinter_train.models.loading import load_model
from sprinter_train.verifier.checkpoint import (
    MLPVerifier,
    load_verifier,
    save_verifier,
    verifier_path,
)
from sprinter_train.verifier.data import split_features
from sprinter_train.verifier.features import FeatureSpec
from sprinter_train.verifier.module import VerifierModule
from sprinter_train.verifier.scorer import CheckpointVerifier
from tests.scorer_helpers import DRAFT, D, draft_step, new_batch, write_records
from tests.synthetic import SYNTHETIC_FEATURES, write_synthetic_records


def mlp_module(d: int, hidden: int = 8) -> VerifierModule:
    torch.manual_seed(0)
    module = VerifierModule(d, head="mlp", mlp_hidden=hidden, mlp_dropout=0.5).eval()
    module.mean.copy_(torch.randn(d))
    module.scale.copy_(torch.rand(d) + 0.5)
    return module


def save_mlp(module: VerifierModule, path: Path, meta: dict) -> Path:
    tensors = module.folded_mlp()
    weight, bias = tensors.pop("weight"), tensors.pop("bias")
    return save_verifier(path, weight, bias, {"head": "mlp", **meta}, tensors)


def test_an_mlp_checkpoint_round_trips_to_the_same_scores(tmp_path: Path) -> None:
    module = mlp_module(7)
    x = torch.randn(50, 7) * 3
    expected = torch.sigmoid(module(x)).detach().numpy()
    path = save_mlp(module, tmp_path / "verifier-lam1.2-mlp.safetensors", {"lam": 1.2, "d": 7})
    loaded = load_verifier(path)
    assert isinstance(loaded.model, MLPVerifier) and loaded.head == "mlp"
    np.testing.assert_allclose(loaded.score(x), expected, rtol=1e-5, atol=1e-6)
    assert path == verifier_path(tmp_path, 1.2, "mlp")


def test_the_decoders_scorer_evaluates_the_mlp_as_training_does(tmp_path: Path) -> None:
    record = write_records(tmp_path / "toy")
    path = save_mlp(
        mlp_module(D, 16),
        verifier_path(tmp_path / "ck", 1.0, "mlp"),
        {"lam": 1.0, "features": {"names": ["hidden"], "d_in": D}},
    )
    checkpoint = load_verifier(path)
    features, rows = split_features(open_records(tmp_path / "toy"), None, FeatureSpec(("hidden",)))
    trained = checkpoint.score(features.batch())
    draft = load_model(DRAFT, "draft", torch.device("cpu"), torch.float32).model
    scorer = CheckpointVerifier(checkpoint, draft)
    batch = new_batch()
    decoded = scorer(None, batch, None, draft_step(record, list(rows))).numpy()
    np.testing.assert_allclose(decoded, trained, rtol=0, atol=1e-5)
    assert batch.stats.verifier_seconds > 0  # priced like the linear verifier


@pytest.fixture
def trained(compose_cfg, tmp_path: Path):
    write_synthetic_records(
        tmp_path / "artifacts" / "syn", rows=6000, d=12, shard_rows=4096, margin=3.0, noise=0.3
    )
    cfg = compose_cfg(
        "stage=train",
        "experiment=syn",
        f"checkpoints_root={tmp_path / 'checkpoints'}",
        "train.batch_size=512",
        "train.lam=1",
        "train.head=mlp",
        "train.mlp.hidden=16",
        "train.learning_curve=[]",
        SYNTHETIC_FEATURES,
    )
    return cfg, run_stage(cfg)


def test_the_mlp_head_trains_beside_the_linear_one(trained) -> None:
    cfg, result = trained
    assert result["verifier_lam1"]["test"]["auc_q_le_p"] > 0.9
    path = verifier_path(cfg.checkpoint_dir, 1.0, "mlp")
    assert path.exists() and not verifier_path(cfg.checkpoint_dir, 1.0).exists()
    checkpoint = load_verifier(path)
    assert checkpoint.meta["head"] == "mlp" and checkpoint.meta["mlp"]["hidden"] == 16
    records = open_records(cfg.experiment_dir)
    rows = records.rows_of("test")
    logits = verifier_logits(cfg, records, rows, {"mlp": checkpoint})["mlp"]  # evaluate's path
    features, test_rows = split_features(records, "test", checkpoint.spec)
    np.testing.assert_array_equal(rows, test_rows)
    np.testing.assert_allclose(logits, checkpoint.logits(features.batch()), rtol=0, atol=1e-6)


def test_export_refuses_an_mlp_verifier_by_name(trained) -> None:
    from sprinter_train.stages.export import verifier_file

    cfg, _ = trained
    node = OmegaConf.create({"verifier": {"lam": 1, "head": "mlp"}})
    with pytest.raises(ValueError, match="linear verifiers only.*mlp head"):
        verifier_file(cfg, node)


@pytest.mark.parametrize("kind", ["online", "entropy"])
def test_export_refuses_a_verifier_without_a_file(trained, kind) -> None:
    """The online logistic and the entropy rule have no file for the folder to carry."""
    from sprinter_train.stages.export import verifier_file

    cfg, _ = trained
    node = OmegaConf.create({"verifier": {"kind": kind, "lam": 1}})
    with pytest.raises(ValueError, match=f"verifier.kind={kind}.*without a file"):
        verifier_file(cfg, node)
