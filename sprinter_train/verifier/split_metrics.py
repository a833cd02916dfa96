"""Figures of a label and a fitted verifier per split: the label's base rate, the verifier's
logits on the val and test rows, and their BCE and AUCs, raw and at the fitted temperature."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sprinter_train.core.classification import auc
from sprinter_train.harvest.reader import RecordSet
from sprinter_train.verifier.checkpoint import LinearVerifier, MLPVerifier, VerifierCheckpoint
from sprinter_train.verifier.data import split_features, split_targets
from sprinter_train.verifier.features import DraftEmbedder, FeatureSpec
from sprinter_train.verifier.labels import Label, labels_at


def class_balance(records: RecordSet, label: Label) -> dict[str, Any]:
    """The label's base rate per split: the fraction with q/p <= λ, or the mean min(1, p/q)."""
    values = records.frame[label.column].to_numpy()
    split = records.frame["split"].to_numpy()
    key = "positive_fraction" if label.kind == "ratio" else "mean_accept_prob"
    out: dict[str, Any] = {}
    for name in ("train", "val", "test"):
        targets = label.targets(values[split == name])
        out[name] = {
            "rows": int(len(targets)),
            key: float(targets.mean()) if len(targets) else None,
        }
    return out


SplitLogits = dict[str, tuple[torch.Tensor, np.ndarray]]


def split_logits(
    verifier: VerifierCheckpoint | LinearVerifier | MLPVerifier,
    records: RecordSet,
    spec: FeatureSpec,
    embedder: DraftEmbedder | None,
) -> SplitLogits:
    """(logits w·s + b, global rows) of the val and test splits; a split without rows is left
    out."""
    model = verifier.model if isinstance(verifier, VerifierCheckpoint) else verifier
    out: SplitLogits = {}
    for split in ("val", "test"):
        features, rows = split_features(records, split, spec, embedder)
        if len(rows):
            with torch.no_grad():
                out[split] = (model.logits(features.batch()), rows)
    return out


def split_metrics(
    logits: SplitLogits, records: RecordSet, label: Label, temperature: float = 1.0
) -> dict[str, Any]:
    """Per split: BCE against the training label, raw and at temperature T; AUC against
    q/p <= 1 and, for a ratio label, against q/p <= λ; for the soft label, the mean target
    and the mean calibrated score (do they agree on average?)."""
    ratio_all = records.frame["ratio"].to_numpy()
    out: dict[str, Any] = {}
    for split in ("val", "test"):
        if split not in logits:
            out[split] = None
            continue
        z, rows = logits[split]
        y = torch.from_numpy(split_targets(records, rows, label))
        score = torch.sigmoid(z).numpy()
        entry: dict[str, Any] = {
            "rows": int(len(rows)),
            "bce": float(torch.nn.functional.binary_cross_entropy_with_logits(z, y)),
        }
        if label.kind == "ratio":
            entry["auc_label_lam"] = auc(y.numpy(), score)
        entry["auc_q_le_p"] = auc(labels_at(ratio_all[rows], 1.0), score)
        entry["bce_calibrated"] = float(
            torch.nn.functional.binary_cross_entropy_with_logits(z / temperature, y)
        )
        if label.kind == "accept_prob":
            entry["mean_label"] = float(y.mean())
            entry["mean_score_calibrated"] = float(torch.sigmoid(z / temperature).mean())
        out[split] = entry
    return out
