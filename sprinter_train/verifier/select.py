"""Model selection for the verifier: a small family of linear heads fitted on the train split,
the one with the best validation AUC kept, so the verifier cannot lose to its own inputs.

A single unregularised Linear(d, 1) on a 576-wide hidden state beside a few scalars, fitted
on a few thousand rows, can rank worse than one of those scalars alone. The
family (train.select):

- `scalars`: the scalar features alone (the dense blocks' weights are zero), an L2 logistic
  on standardised inputs; absent when the features hold no dense block or no scalar;
- `ridge`: every feature, the dense blocks' (hidden state, embedding, target state) L2
  strength chosen on val from `l2_grid`, the scalars' held at `l2_scalars`;
- `full`: the head Lightning trained (the SPRINTER verifier; with `features: [hidden]` and
  selection off, the paper's).

The first two are full-batch L-BFGS fits of the mean BCE plus 0.5 * l2 * |w|^2 on inputs
standardised with the fitted rows' statistics (the soft label's targets as given), on at
most `max_train_rows` train rows: a few seconds. Every candidate is scored by its val AUC
against q/p <= 1 (the report's label, and the only AUC of the soft label); the winner is the
simplest (scalars, then ridge from the strongest l2, then full) within `tie` of the best.
Each is a Linear on raw features with the standardisation folded in, over the full feature
layout, so the checkpoint, the decoder's scorer and the export read it unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sprinter_train.core.classification import auc
from sprinter_train.harvest.reader import RecordSet
from sprinter_train.verifier.data import rows_features, split_features, split_targets
from sprinter_train.verifier.features import Embedder, FeatureSpec
from sprinter_train.verifier.labels import Label, labels_at

ORDER = ("scalars", "ridge", "full")  # simplest first: ties go to the earlier


@dataclass
class Candidate:
    """One head on raw features (standardisation folded in), with its scores."""

    name: str
    weight: torch.Tensor  # (d_in,)
    bias: torch.Tensor  # (1,)
    val_auc: float | None = None
    test_auc: float | None = None
    setting: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def describe(self) -> dict[str, Any]:
        """What the sidecar records of it."""
        return {
            "val_auc_q_le_p": self.val_auc,
            "test_auc_q_le_p": self.test_auc,
            **self.setting,
            "seconds": self.seconds,
        }


@dataclass
class Splits:
    """Standardised float32 inputs of the train subset, val and test; targets and labels."""

    x: dict[str, torch.Tensor]
    y_train: torch.Tensor  # the training label's targets (0/1 or soft)
    y_auc: dict[str, np.ndarray]  # q/p <= 1 of val and test
    mean: torch.Tensor
    scale: torch.Tensor
    dense: torch.Tensor  # (d_in,) bool: the column belongs to a dense block


def load_splits(
    records: RecordSet,
    spec: FeatureSpec,
    label: Label,
    embedder: Embedder | None,
    layout: Sequence[dict[str, Any]],
    max_train_rows: int | None,
    seed: int,
) -> Splits:
    """The three splits' features, the train split capped at a seeded subset (only its rows'
    hidden states are read), all standardised with that subset's statistics (the fits and
    their folded weights do not depend on which: an affine change of inputs)."""
    ratio = records.frame["ratio"].to_numpy()
    train = records.rows_of("train")
    if max_train_rows is not None and len(train) > int(max_train_rows):
        rng = np.random.default_rng(seed)
        train = np.sort(rng.choice(train, int(max_train_rows), replace=False))
    features = rows_features(records, train, spec, embedder)
    mean, scale = features.column_stats()
    x = {"train": (features.batch() - mean) / scale}
    y_train = torch.from_numpy(split_targets(records, train, label)).float()
    y_auc: dict[str, np.ndarray] = {}
    for split in ("val", "test"):
        features, rows = split_features(records, split, spec, embedder)
        x[split] = (features.batch() - mean) / scale
        y_auc[split] = labels_at(ratio[rows], 1.0)
    dense_names = set(spec.dense)
    dense = torch.cat(
        [torch.full((int(b["width"]),), b["name"] in dense_names) for b in layout]
    ).bool()
    return Splits(x, y_train, y_auc, mean, scale, dense)


def fit_logistic(
    x: torch.Tensor,
    y: torch.Tensor,
    l2: torch.Tensor,
    start: tuple[torch.Tensor, torch.Tensor] | None = None,
    max_iter: int = 500,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, b) minimising mean BCE(x w + b, y) + 0.5 * sum(l2 * w^2) by full-batch L-BFGS
    (strong Wolfe line search; deterministic on one machine). A column with an infinite l2
    is held at 0."""
    frozen = torch.isinf(l2)
    penalty = torch.where(frozen, torch.zeros_like(l2), l2)
    if start is None:
        mean = float(y.mean().clamp(1e-4, 1 - 1e-4))
        start = (torch.zeros(x.shape[1]), torch.tensor([np.log(mean / (1 - mean))]))
    w = start[0].clone().float().masked_fill(frozen, 0.0).requires_grad_(True)
    b = start[1].clone().float().reshape(1).requires_grad_(True)
    keep = (~frozen).float()
    optimizer = torch.optim.LBFGS(
        [w, b],
        lr=1.0,
        max_iter=max_iter,
        history_size=20,
        tolerance_grad=1e-7,
        tolerance_change=1e-10,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        z = x @ (w * keep) + b
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z, y)
        loss = loss + 0.5 * (penalty * w * w).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return (w * keep).detach(), b.detach()


def scored(splits: Splits, candidate: Candidate, w: torch.Tensor, b: torch.Tensor) -> Candidate:
    """Fold the standardisation into (w, b), and add the val and test AUC against q/p <= 1."""
    with torch.no_grad():
        for split in ("val", "test"):
            if split in splits.x and len(splits.x[split]):
                score = (splits.x[split] @ w + b).numpy()
                value = auc(splits.y_auc[split], score)
                setattr(candidate, f"{split}_auc", value)
        weight = w / splits.scale
        bias = b - (weight * splits.mean).sum()
    candidate.weight, candidate.bias = weight.detach(), bias.reshape(1).detach()
    return candidate


def fit_family(
    splits: Splits, l2_grid: Sequence[float], l2_scalars: float, max_iter: int = 500
) -> tuple[list[Candidate], dict[str, Any]]:
    """The `scalars` and `ridge` candidates (each where the layout allows it) and the ridge
    grid's val AUC per l2 (the strength is chosen on val, ties to the stronger)."""
    out: list[Candidate] = []
    dense, x, y = splits.dense, splits.x["train"], splits.y_train
    if dense.any() and (~dense).any():
        start = time.perf_counter()
        l2 = torch.where(dense, torch.tensor(float("inf")), torch.tensor(float(l2_scalars)))
        w, b = fit_logistic(x, y, l2, max_iter=max_iter)
        candidate = Candidate("scalars", w, b, setting={"l2_scalars": float(l2_scalars)})
        out.append(scored(splits, candidate, w, b))
        candidate.seconds = time.perf_counter() - start
    grid: dict[str, Any] = {}
    if dense.any():
        start = time.perf_counter()
        best: Candidate | None = None
        previous: tuple[torch.Tensor, torch.Tensor] | None = None
        for strength in sorted((float(v) for v in l2_grid), reverse=True):  # strong to weak
            l2 = torch.where(dense, torch.tensor(strength), torch.tensor(float(l2_scalars)))
            w, b = fit_logistic(x, y, l2, start=previous, max_iter=max_iter)
            previous = (w, b)
            setting = {"l2_dense": strength, "l2_scalars": float(l2_scalars)}
            candidate = scored(splits, Candidate("ridge", w, b, setting=setting), w, b)
            grid[f"{strength:g}"] = candidate.val_auc
            if best is None or (candidate.val_auc or 0.0) > (best.val_auc or 0.0):
                best = candidate
        assert best is not None
        best.setting["l2_grid_val_auc"] = grid
        best.seconds = time.perf_counter() - start
        out.append(best)
    return out, grid


def choose(candidates: Sequence[Candidate], tie: float) -> Candidate:
    """The simplest candidate (ORDER) whose val AUC is within `tie` of the best one's. With no
    val AUC at all there is nothing to choose on: refused, not a pick by list order
    (verifier/evidence.py refuses such a val split before any fit)."""
    if all(c.val_auc is None for c in candidates):
        raise ValueError(
            f"train.select: no candidate of {[c.name for c in candidates]} has a val AUC "
            "(the val split holds one class of q/p <= 1): nothing to choose on"
        )
    ranked = sorted(candidates, key=lambda c: ORDER.index(c.name))
    best = max((c.val_auc or 0.0) for c in ranked)
    return next(c for c in ranked if (c.val_auc or 0.0) >= best - float(tie))
