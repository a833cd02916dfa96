"""An sd_learned export on the offline draft, for the vLLM integration's tests: a verifier with
seeded random weights over the features the trained one reads (its scores spread over (0, 1),
so rows stop at different drafts), a latency profile where drafting pays, and the folder
`stage=export` writes from them. A fresh clone has no trained verifier; these tests check
that vLLM computes what the project computes, whatever the weights."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from sprinter_train.__main__ import run_stage
from sprinter_train.bench.timing.latency import LatencyProfile
from sprinter_train.core.config import compose_config, conf_defaults
from sprinter_train.verifier.checkpoint import save_verifier, verifier_path
from sprinter_train.verifier.features import FeatureSpec
from sprinter_train.verifier.labels import Label

DRAFT = "checkpoints/drafts/smollm2-draft"
# the features stage=train's default verifier reads (conf/train/default.yaml), with settings
FEATURES = list(conf_defaults("train/default.yaml", "features"))
SETTINGS = {"run_position_cap": 8.0, "accept_prior": 0.5, "accept_n0": 4.0}
HIDDEN = 576  # the offline draft's width (and its embedding's)


def write_verifier(path: Path, seed: int = 0, scale: float = 3.0) -> Path:
    """A soft-label verifier (temperature-calibrated, as stage=train writes one) on the draft."""
    spec = FeatureSpec.from_names(FEATURES, SETTINGS)
    d_in = sum(part["width"] for part in spec.layout(HIDDEN, embed_dim=HIDDEN))
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(d_in, generator=generator) * scale / math.sqrt(d_in)
    meta = {
        "features": {"names": list(spec.names), "d_in": d_in, "settings": spec.describe()},
        "hidden_layer": -1,
        "draft_model": DRAFT,
        "label": "accept_prob",
        "lam": None,
        "calibration": {"method": "temperature", "temperature": 1.3, "fitted_on": "val"},
        "class_balance": {"train": {"positive_fraction": 0.5, "mean_accept_prob": 0.55}},
    }
    return save_verifier(path, weight, torch.tensor([0.4]), meta)


def write_latency(path: Path) -> Path:
    """A target forward of 20 ms + 0.5 ms a token, a drafting step of 2 ms (batch 1; the
    profile's own batch scaling elsewhere): a few drafts a round pay."""
    target = {n: 20.0 + 0.5 * n for n in range(1, 17)}
    LatencyProfile(target, 2.0, 1.0, 128, "cpu", "float32").save(path)
    return path


def export_folder(root: Path) -> Path:
    """`stage=export export.method=sd_learned` of the verifier and profile above."""
    overrides = [
        "models=offline_default",
        "models.companion=null",
        f"artifacts_root={root / 'artifacts'}",
        f"checkpoints_root={root / 'checkpoints'}",
        "experiment=vllm_test",
        "device=cpu",
        "dtype=float32",
    ]
    cfg = compose_config("stage=export", "export.method=sd_learned", *overrides)
    write_verifier(verifier_path(Path(cfg.checkpoint_dir), Label("accept_prob")))
    write_latency(Path(cfg.experiment_dir) / "bench" / "latency.json")
    return Path(run_stage(cfg)["export_dir"])
