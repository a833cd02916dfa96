"""train.select on a fitted linear head: the Lightning head set beside select.py's family
(scalars only, ridge), the one with the best val AUC kept, and what the sidecar records of
the choice."""

from __future__ import annotations

import logging
import time
from typing import Any

from omegaconf import DictConfig

from sprinter_train.harvest.reader import RecordSet
from sprinter_train.verifier.checkpoint import LinearVerifier
from sprinter_train.verifier.features import DraftEmbedder, FeatureSpec
from sprinter_train.verifier.labels import Label
from sprinter_train.verifier.select import Candidate, choose, fit_family, load_splits, scored

log = logging.getLogger(__name__)


def select_head(
    cfg: DictConfig,
    records: RecordSet,
    label: Label,
    spec: FeatureSpec,
    embedder: DraftEmbedder | None,
    layout: list[dict[str, Any]],
    trained: LinearVerifier,
    trained_seconds: float = 0.0,
) -> tuple[LinearVerifier, dict[str, Any]]:
    """train.select (verifier/select.py): the Lightning head (`full`) beside the scalar-only
    and the ridge heads, the one with the best val AUC kept (ties to the simpler); returns it
    as a LinearVerifier on raw features and what the sidecar records of the choice."""
    scfg = cfg.train.select
    start = time.perf_counter()
    cap = scfg.get("max_train_rows")
    splits = load_splits(
        records,
        spec,
        label,
        embedder,
        layout,
        None if cap is None else int(cap),
        int(cfg.train.seed),
    )
    candidates, _ = fit_family(
        splits,
        [float(v) for v in scfg.l2_grid],
        float(scfg.l2_scalars),
        int(scfg.get("max_iter", 500)),
    )
    raw_w = trained.linear.weight.detach()[0].float()
    raw_b = trained.linear.bias.detach().float()
    # the trained head in the standardised space the others were scored in
    w_std, b_std = raw_w * splits.scale, raw_b + (raw_w * splits.mean).sum()
    full = Candidate("full", w_std, b_std, seconds=trained_seconds)
    candidates.append(scored(splits, full, w_std, b_std))
    winner = choose(candidates, float(scfg.tie))
    chosen = LinearVerifier(int(raw_w.numel()))
    chosen.linear.weight.data.copy_(winner.weight[None])
    chosen.linear.bias.data.copy_(winner.bias)
    selection = {
        "chosen": winner.name,
        "metric": "val AUC against q/p <= 1",
        "tie": float(scfg.tie),
        "candidates": {c.name: c.describe() for c in candidates},
        "train_rows": int(len(splits.y_train)),
        "seconds": time.perf_counter() - start,
        "note": "scalars: the scalar features alone (dense weights 0); ridge: L2 on the dense "
        "blocks chosen on val; full: the Lightning head. All on standardised inputs, folded.",
    }
    log.info(
        "train.select: %s kept (val AUC %s)",
        winner.name,
        {c.name: None if c.val_auc is None else round(c.val_auc, 4) for c in candidates},
    )
    return chosen, selection
