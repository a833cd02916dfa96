"""The sd_learned tests' verifiers and costs: real exported linear verifiers with seeded
weights on tiny drafts, and LearnedLength policies reading them before and after the draw."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from sprinter_train.decoding.policies import LearnedLength
from sprinter_train.models.tiny import TINY_DEFAULTS
from sprinter_train.verifier.checkpoint import (
    LinearVerifier,
    VerifierCheckpoint,
    save_verifier,
    verifier_path,
)
from sprinter_train.verifier.features import FeatureSpec
from sprinter_train.verifier.labels import Label
from sprinter_train.verifier.scorer import CheckpointVerifier
from tests.decoding_helpers import ATable, latency, step_cost  # noqa: F401  (the tests' costs)


def linear_verifier(
    draft: torch.nn.Module,
    names: list[str],
    scale: float,
    settings: dict[str, float] | None = None,
) -> CheckpointVerifier:
    """A real exported verifier on these features (`settings`: the ones they need, as
    train.feature_settings), with seeded random weights times `scale`."""
    spec = FeatureSpec.from_names(names, settings)
    d = draft.config.hidden_size
    d_in = sum(part["width"] for part in spec.layout(d, embed_dim=d))
    model = LinearVerifier(d_in)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        model.linear.weight.copy_(torch.randn((1, d_in), generator=gen) * scale / math.sqrt(d_in))
        model.linear.bias.zero_()
    features = {"names": list(spec.names), "d_in": d_in, "settings": spec.describe()}
    meta = {"lam": 1.0, "features": features}
    return CheckpointVerifier(VerifierCheckpoint(model, meta, Path("test")), draft)


def before_draw(models) -> LearnedLength:
    """The paper's input, the draft hidden state that produced q_j, with SV's table."""
    verifier = linear_verifier(models["draft"], ["hidden"], scale=2.0)
    return LearnedLength(verifier, ATable(), max_gamma=4)


def by_token(models) -> CheckpointVerifier:
    """Scores from the drafted token's own embedding: near 0 for some tokens, near 1 for others."""
    return linear_verifier(models["draft"], ["token_embedding"], scale=150.0)


def after_draw(models) -> LearnedLength:
    return LearnedLength(by_token(models), None, max_gamma=4)


def constant_accept_verifier(checkpoint_dir: str | Path, mean_label: float) -> Path:
    """A calibrated soft-label verifier of the tiny draft that scores every draft 0.8 (zero
    weights, bias log 4), its train split's mean label `mean_label` (what the bench's score
    guard compares the run's mean score with)."""
    path = verifier_path(checkpoint_dir, Label("accept_prob"))
    path.parent.mkdir(parents=True)
    meta = {
        "lam": None,
        "label": "accept_prob",
        "calibration": {"method": "temperature", "temperature": 1.0},
        "class_balance": {"train": {"rows": 900, "mean_accept_prob": mean_label}},
        "features": {"names": ["hidden"], "d_in": TINY_DEFAULTS["hidden_size"]},
    }
    weight = torch.zeros(TINY_DEFAULTS["hidden_size"])
    return save_verifier(path, weight, torch.tensor([math.log(4)]), meta)
