"""evaluate.ceiling on the records: the rows and features ceiling.py's probes are fitted on.

At most `max_train_rows` train rows (a seeded random subset) and every val and test row; the
draft's embedding of x joins the features when it can be loaded, else a note says why not.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from omegaconf import DictConfig

from sprinter_train.evaluation.bootstrap import PromptBootstrap
from sprinter_train.evaluation.ceiling import ceiling
from sprinter_train.harvest.reader import RecordSet
from sprinter_train.verifier.embedder import make_embedder
from sprinter_train.verifier.features import FeatureSpec

log = logging.getLogger(__name__)


def ceiling_report(cfg: DictConfig, records: RecordSet) -> dict[str, Any] | None:
    """What the draft's features predict, linear or not; None when evaluate.ceiling is off."""
    ccfg = cfg.evaluate.ceiling
    if not ccfg.enabled:
        return None
    frame = records.frame
    split = frame["split"].to_numpy()
    rng = np.random.default_rng(int(cfg.evaluate.seed))
    train = np.flatnonzero(split == "train")
    if len(train) > int(ccfg.max_train_rows):
        train = np.sort(rng.choice(train, int(ccfg.max_train_rows), replace=False))
    rows = np.sort(np.concatenate([train, np.flatnonzero((split == "val") | (split == "test"))]))
    embedding, skipped = None, None
    if ccfg.embedding:
        try:
            embedder = make_embedder(cfg, FeatureSpec(("hidden", "token_embedding")), records)
            embedding = embedder(frame["token_id"].to_numpy()[rows])
        except (ValueError, OSError) as error:  # another models.draft, or no way to load it
            skipped = f"the draft's embedding of x was left out: {error}"
            log.warning("evaluate.ceiling: %s", skipped)
    lam = float(ccfg.lam)
    test_prompts = frame["prompt_id"].to_numpy()[rows][split[rows] == "test"]
    boot = PromptBootstrap.from_cfg(cfg.evaluate.bootstrap, test_prompts)
    models = ceiling(
        records.hidden(rows),
        frame["q"].to_numpy()[rows],
        frame["draft_entropy"].to_numpy()[rows],
        frame["ratio"].to_numpy()[rows],
        split[rows],
        lam,
        embedding=embedding,
        c_grid=list(ccfg.c_grid),
        mlp_hidden=int(ccfg.mlp_hidden),
        mlp_alphas=list(ccfg.mlp_alphas),
        seed=int(cfg.evaluate.seed),
        interval=boot.auc_interval,
    )
    counts = {s: int((split[rows] == s).sum()) for s in ("train", "val", "test")}
    return {"lam": lam, "rows": counts, "models": models, "embedding_skipped": skipped}
