"""stage=train on synthetic records with a planted direction: learning, export, splits, sweeps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sprinter_train.__main__ import run_stage
from sprinter_train.core.io import read_json
from sprinter_train.harvest.reader import MissingInputError, open_records
from sprinter_train.verifier import fit as train_module
from sprinter_train.verifier.checkpoint import (
    LinearVerifier,
    lam_name,
    load_verifier,
    save_verifier,
    verifier_path,
)
from sprinter_train.verifier.data import VerifierDataModule, split_features
from sprinter_train.verifier.features import FeatureSpec
from sprinter_train.verifier.labels import labels_at
from sprinter_train.verifier.module import VerifierModule
from tests.synthetic import SYNTHETIC_FEATURES, write_synthetic_records

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def synthetic(tmp_path: Path) -> dict:
    return write_synthetic_records(
        tmp_path / "artifacts" / "syn", rows=12_000, d=24, shard_rows=4096, margin=3.0, noise=0.3
    )


def train_cfg(
    compose_cfg, tmp_path: Path, *overrides: str, features: str | None = SYNTHETIC_FEATURES
):
    """`features`: None keeps the configuration's own (train=paper's)."""
    return compose_cfg(
        "stage=train",
        "experiment=syn",
        f"checkpoints_root={tmp_path / 'checkpoints'}",
        "train.batch_size=512",
        *([features] if features else []),
        *overrides,
    )


@pytest.mark.heavy  # stage=train whole, learning curve included: make test, not test-quick
def test_linear_verifier_recovers_the_planted_direction(compose_cfg, tmp_path, synthetic) -> None:
    cfg = train_cfg(compose_cfg, tmp_path, "train=paper", "train.lam=1", features=None)  # Lightning
    result = run_stage(cfg)["verifier_lam1"]
    assert result["test"]["auc_q_le_p"] > 0.95
    checkpoint = load_verifier(verifier_path(cfg.checkpoint_dir, 1.0))
    weight = checkpoint.model.linear.weight.detach().numpy()[0]
    cosine = weight @ synthetic["direction"] / np.linalg.norm(weight)
    assert cosine > 0.95  # acceptable (q/p small) where h . w is large: same sign
    assert 0 <= result["best_epoch"] < result["epochs_run"] <= cfg.train.max_epochs
    meta = checkpoint.meta
    assert meta["lam"] == 1.0 and meta["d"] == 24 and meta["hidden_layer"] == -1
    assert meta["features"]["layout"] == [{"name": "hidden", "width": 24}]
    assert meta["draft_model"] == "synthetic"
    assert meta["draft_identity"]["id"] == "synthetic"  # all of it is compared by the bench
    assert meta["fitted_prompts"]["splits"] == ["train", "val"]
    assert len(meta["fitted_prompts"]["id_sha256"]) == synthetic_prompts(cfg, ("train", "val"))
    assert meta["records"]["manifest_sha256"] == open_records(cfg.experiment_dir).manifest_hash
    balance = meta["class_balance"]
    assert 0.2 < balance["train"]["positive_fraction"] < 0.8 and balance["test"]["rows"] > 0
    summary = read_json(Path(cfg.experiment_dir) / "train" / "lam1" / "summary.json")
    assert summary["checkpoint"] == str(checkpoint.path)
    assert (Path(cfg.experiment_dir) / "train" / "lam1" / "metrics.csv").read_text().count("\n") > 1


def test_a_checkpoint_round_trips_to_the_same_scores(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = VerifierModule(7)
    module.mean.copy_(torch.randn(7))
    module.scale.copy_(torch.rand(7) + 0.5)
    x = torch.randn(50, 7) * 3
    expected = torch.sigmoid(module(x)).detach().numpy()
    weight, bias = module.folded()
    path = save_verifier(
        tmp_path / "verifier-lam1.2.safetensors", weight, bias, {"lam": 1.2, "d": 7}
    )
    loaded = load_verifier(path)
    np.testing.assert_allclose(loaded.score(x), expected, rtol=1e-5, atol=1e-6)
    assert loaded.lam == 1.2
    plain = LinearVerifier(7)
    plain.load_state_dict(loaded.model.state_dict())
    np.testing.assert_allclose(plain(x).detach().numpy(), expected, rtol=1e-5, atol=1e-6)


def test_labels_are_q_over_p_at_most_lambda() -> None:
    ratio = np.array([0.5, 1.0, 1.1, 1.2, 1.5, np.inf])
    assert labels_at(ratio, 1.0).tolist() == [1, 1, 0, 0, 0, 0]
    assert labels_at(ratio, 1.2).tolist() == [1, 1, 1, 1, 0, 0]
    assert labels_at(ratio, 1.5).tolist() == [1, 1, 1, 1, 1, 0]  # p = 0: never acceptable
    assert lam_name(1.0) == "1" and lam_name(1.2) == "1.2" and lam_name(1.5) == "1.5"


def test_splits_follow_the_records_split_column_by_prompt(synthetic) -> None:
    records = open_records(synthetic["records_dir"].parent)
    module = VerifierDataModule(records, FeatureSpec(), 1.2, 256)
    module.setup("fit")
    prompts = {}
    for split in ("train", "val", "test"):
        _, rows = split_features(records, split, FeatureSpec())
        assert (records.frame["split"].to_numpy()[rows] == split).all()
        prompts[split] = set(records.frame["prompt_id"].to_numpy()[rows])
    assert not (prompts["train"] & prompts["val"]) and not (prompts["train"] & prompts["test"])
    features, labels = module.data["train"]
    assert len(features) == len(prompts["train"]) * 32 and labels.dtype == torch.float32
    # each epoch is a new permutation of every training row, in batches of 256
    loader = module.train_dataloader()
    seen = torch.cat([y for _, y in loader])
    assert len(seen) == len(labels) and len(loader) == -(-len(labels) // 256)
    assert seen.sum() == labels.sum()


@pytest.mark.heavy  # stage=train whole, learning curve included: make test, not test-quick
def test_extra_features_extend_the_input(compose_cfg, tmp_path, synthetic) -> None:
    cfg = train_cfg(
        compose_cfg, tmp_path, "train.lam=1.2", "train.features=[draft_entropy,hidden,q]"
    )
    run_stage(cfg)
    meta = load_verifier(verifier_path(cfg.checkpoint_dir, 1.2)).meta
    assert meta["features"]["names"] == ["hidden", "q", "draft_entropy"]  # the fixed layout order
    assert meta["features"]["d_in"] == 26
    with pytest.raises(ValueError, match="train.features"):
        run_stage(train_cfg(compose_cfg, tmp_path, "train.features=[logits]"))


def test_missing_records_name_stage_harvest(compose_cfg, tmp_path) -> None:
    with pytest.raises(MissingInputError, match="records folder .* does not exist.*stage=harvest"):
        run_stage(train_cfg(compose_cfg, tmp_path, "experiment=never_harvested"))


def test_wandb_is_closed_when_training_fails(compose_cfg, tmp_path, synthetic, monkeypatch) -> None:
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")

    def crash(self, *args, **kwargs):
        self.loggers[1].experiment  # noqa: B018 - start the offline run, as fit would
        raise RuntimeError("simulated failure inside fit")

    monkeypatch.setattr(train_module.pl.Trainer, "fit", crash)
    cfg = train_cfg(compose_cfg, tmp_path, "train.lam=1", "logger.wandb.enabled=true")
    with pytest.raises(RuntimeError, match="simulated failure"):
        run_stage(cfg)
    assert wandb.run is None


@pytest.mark.heavy
def test_hydra_multirun_sweeps_lambda(tmp_path, synthetic) -> None:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    command = [
        sys.executable,
        "-m",
        "sprinter_train",
        "-m",
        "stage=train",
        "train.lam=1,1.5",
        "experiment=syn",
        f"artifacts_root={tmp_path / 'artifacts'}",
        f"checkpoints_root={tmp_path / 'checkpoints'}",
        f"hydra.sweep.dir={tmp_path / 'multirun'}",
        "device=cpu",
        "num_threads=1",
        "train.batch_size=1024",
        SYNTHETIC_FEATURES,
    ]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for lam in (1.0, 1.5):
        assert load_verifier(verifier_path(tmp_path / "checkpoints" / "syn", lam)).lam == lam
    assert not verifier_path(tmp_path / "checkpoints" / "syn", 1.2).exists()


@pytest.mark.slow  # about 75 s on 2 CPU cores (two spawned ranks): outside the smoke subset
def test_ddp_over_two_cpu_processes(compose_cfg, tmp_path, synthetic) -> None:
    cfg = train_cfg(compose_cfg, tmp_path, "train.lam=1.2", "train.devices=2", "train.strategy=ddp")
    result = run_stage(cfg)["verifier_lam1.2"]
    assert result["world_size"] == 2
    assert result["test"]["auc_q_le_p"] > 0.95
    assert result["epochs_run"] >= 1 and np.isfinite(result["best_val_loss"])


def test_small_train_splits_get_smaller_batches(synthetic) -> None:
    records = open_records(synthetic["records_dir"].parent)
    module = VerifierDataModule(records, FeatureSpec(), 1.2, 4096, min_batches_per_epoch=32)
    assert module.train_batch_size(9600, 1) == 300  # 32 steps an epoch, not 3
    assert module.train_batch_size(9600, 2) == 150  # per rank
    assert module.train_batch_size(1_000_000, 1) == 4096  # the cap
    assert module.train_batch_size(10, 1) == 1


def test_with_train_prompts_keeps_a_nested_share_of_train_prompts(synthetic) -> None:
    records = open_records(synthetic["records_dir"].parent)
    split = records.frame["split"].to_numpy()
    prompts = records.frame["prompt_id"].to_numpy()
    all_train = set(prompts[split == "train"])
    kept = {}
    for fraction in (0.25, 0.5):
        subset = records.with_train_prompts(fraction, seed=3)
        sub_split = subset.frame["split"].to_numpy()
        kept[fraction] = set(prompts[sub_split == "train"])
        assert len(kept[fraction]) == round(fraction * len(all_train))
        for other in ("val", "test"):  # untouched
            assert ((sub_split == other) == (split == other)).all()
        assert set(prompts[sub_split == "unused"]) == all_train - kept[fraction]
    assert kept[0.25] < kept[0.5]
    assert (records.frame["split"].to_numpy() == split).all()  # the original is not modified


@pytest.mark.heavy  # stage=train whole, learning curve included: make test, not test-quick
def test_learning_curve_lands_in_the_sidecar(compose_cfg, tmp_path, synthetic) -> None:
    cfg = train_cfg(compose_cfg, tmp_path, "train.lam=1", "train.learning_curve=[0.5,0.1]")
    result = run_stage(cfg)["verifier_lam1"]
    points = load_verifier(verifier_path(cfg.checkpoint_dir, 1.0)).meta["metrics"]["learning_curve"]
    assert [p["fraction"] for p in points] == [0.1, 0.5, 1.0]
    rows = [p["train_rows"] for p in points]
    assert rows[0] < rows[1] < rows[2] == result["train_rows"]
    assert points[-1]["test_auc_q_le_p"] == result["test"]["auc_q_le_p"]
    assert all(0.5 < p["test_auc_q_le_p"] <= 1 for p in points)
    assert (Path(cfg.experiment_dir) / "train" / "lam1" / "curve-0.1" / "metrics.csv").exists()


def test_a_train_split_of_one_class_is_refused_naming_lambda(compose_cfg, tmp_path, synthetic):
    """Every train label negative (λ below every q/p) trained an all-negative verifier, exit 0."""
    from sprinter_train.verifier.train import train_verifier

    cfg = train_cfg(compose_cfg, tmp_path, "train.lam=1")
    records = open_records(cfg.experiment_dir, columns=["split", "ratio", "prompt_id"])
    records.frame["ratio"] = 5.0  # q/p = 5 everywhere: no token is acceptable at λ = 1
    with pytest.raises(ValueError, match=r"every train label of q/p <= 1 is negative.*λ = 1\.0"):
        train_verifier(cfg, records, 1.0)
    assert not verifier_path(cfg.checkpoint_dir, 1.0).exists()


def synthetic_prompts(cfg, splits) -> int:
    frame = open_records(cfg.experiment_dir, columns=["split", "prompt_id"]).frame
    return int(frame["prompt_id"][frame["split"].isin(splits)].nunique())
