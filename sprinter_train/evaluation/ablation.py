"""evaluate.ablation: what each verifier feature group adds, on the report's test rows.

The groups are the verifier features in decoding/features/table.py's feature_order(), so a
feature declared there joins the table with nothing to change here; a group the records cannot give (a column they lack, a
draft embedding that cannot be loaded) is left out with the reason. Every probe is fitted as
evaluate.ceiling's linear ones are (ceiling.fit_best: an L2 logistic on standardised inputs,
fitted on a capped train subset at q/p <= λ, its C chosen by val AUC) and scored on the test
rows against q/p <= 1 with the prompt-bootstrap interval. Drop-one removes one group from all
of them (a large loss: the group carries signal no other group has); add-one puts one group
beside the base group (`base`, the verifier's default input `hidden`), or, with no base, fits
each group alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf
from sklearn.linear_model import LogisticRegression

from sprinter_train.decoding.features.table import feature_order
from sprinter_train.evaluation.bootstrap import PromptBootstrap
from sprinter_train.evaluation.ceiling import Interval, fit_best
from sprinter_train.harvest.reader import RecordSet
from sprinter_train.verifier.data import rows_features
from sprinter_train.verifier.embedder import make_embedder
from sprinter_train.verifier.features import FeatureSpec

log = logging.getLogger(__name__)

Blocks = dict[str, np.ndarray]  # group -> (rows, width) float32


def ablate(
    blocks: Mapping[str, np.ndarray],
    ratio: np.ndarray,
    split: np.ndarray,
    lam: float,
    base: str | None,
    c_grid: Sequence[float],
    interval: Interval | None = None,
) -> dict[str, Any]:
    """Test AUC (against q/p <= 1) of probes on: every group, every group but one, and the
    base group plus one (each group alone without a base); the loss and gain beside each."""
    order = feature_order()
    groups = [g for g in order if g in blocks] + [g for g in blocks if g not in order]
    y_train, y_eval = ratio <= lam, ratio <= 1.0

    def fit(names: Sequence[str]) -> dict[str, Any]:
        x = np.hstack([np.asarray(blocks[n], dtype=np.float32) for n in names])
        return {
            "groups": list(names),
            **fit_best(logistic, c_grid, x, y_train, y_eval, split, interval),
        }

    everything = fit(groups)
    out: dict[str, Any] = {"groups": groups, "all": everything, "drop_one": {}, "add_one": {}}
    full = everything.get("test_auc")
    if len(groups) > 1:
        for group in groups:
            entry = fit([g for g in groups if g != group])
            entry["loss"] = (
                None if full is None or entry["test_auc"] is None else full - entry["test_auc"]
            )
            out["drop_one"][group] = entry
    kept_base = base if base in groups else None
    out["base"] = kept_base
    out["add_one_mode"] = f"{kept_base} + one group" if kept_base else "each group alone"
    reference = fit([kept_base]) if kept_base else None
    if reference is not None:
        out["base_fit"] = reference
    for group in groups:
        if group == kept_base:
            continue
        entry = fit([kept_base, group] if kept_base else [group])
        if reference is not None:
            floor = reference.get("test_auc")
            entry["gain"] = (
                None if floor is None or entry["test_auc"] is None else entry["test_auc"] - floor
            )
        out["add_one"][group] = entry
    return out


def logistic(c: float) -> LogisticRegression:
    return LogisticRegression(C=c, max_iter=3000)


def group_blocks(
    records: RecordSet,
    rows: np.ndarray,
    wanted: Sequence[str],
    embedder_of: Callable[[], Any],
    settings: Mapping[str, Any] | None = None,
) -> tuple[Blocks, dict[str, str]]:
    """Each wanted group's float32 block on `rows`, built by the verifier's own rows_features
    with `settings` (train.feature_settings: the run position's cap, the acceptance prior);
    a group the records cannot give is returned in the second dict with the reason."""
    frame = records.frame
    arrays: dict[str, np.ndarray] = {}  # each recorded array read once
    blocks: Blocks = {}
    skipped: dict[str, str] = {}
    for group in wanted:
        try:
            spec = FeatureSpec.from_names([group], settings)
            missing = [c for c in spec.record_columns() if c not in frame.columns]
            if missing:
                skipped[group] = f"the records have no column {', '.join(missing)}"
                continue
            embedder = embedder_of() if "embedding" in spec.widths else None
            features = rows_features(records, rows, spec, embedder, arrays)
        except (ValueError, OSError, KeyError, TypeError) as error:
            skipped[group] = f"{type(error).__name__}: {error}"
            continue
        blocks[group] = features.batch().numpy()
    return blocks, skipped


def ablation_report(
    cfg: DictConfig, records: RecordSet, test_rows: np.ndarray
) -> dict[str, Any] | None:
    """evaluate.ablation on the records (None when it is off): a seeded subset of at most
    `max_train_rows` train rows, at most `max_val_rows` val rows, and the report's test rows."""
    acfg = cfg.evaluate.ablation
    if not acfg.enabled:
        return None
    start = time.perf_counter()
    frame = records.frame
    split_all = frame["split"].to_numpy()
    rng = np.random.default_rng(int(cfg.evaluate.seed))

    def capped(name: str, cap: int | None) -> np.ndarray:
        rows = np.flatnonzero(split_all == name)
        if cap is not None and len(rows) > int(cap):
            rows = np.sort(rng.choice(rows, int(cap), replace=False))
        return rows

    train, val = capped("train", acfg.max_train_rows), capped("val", acfg.max_val_rows)
    rows = np.concatenate([train, val, np.asarray(test_rows)])
    split = np.concatenate(
        [np.full(len(train), "train"), np.full(len(val), "val"), np.full(len(test_rows), "test")]
    )
    order = feature_order()
    wanted = list(order) if acfg.groups is None else [str(g) for g in acfg.groups]
    unknown = sorted(set(wanted) - set(order))
    if unknown:
        raise ValueError(f"evaluate.ablation.groups: unknown {unknown}; choose from {list(order)}")

    def embedder() -> Any:
        if not acfg.embedding:
            raise ValueError("evaluate.ablation.embedding is false")
        return make_embedder(cfg, FeatureSpec(("hidden", "token_embedding")), records)

    settings = OmegaConf.to_container(cfg.train.feature_settings, resolve=True)
    blocks, skipped = group_blocks(records, rows, wanted, embedder, settings)
    for group, why in skipped.items():
        log.warning("evaluate.ablation: %s left out: %s", group, why)
    if not blocks:
        return {"skipped": skipped, "seconds": time.perf_counter() - start}
    test_prompts = frame["prompt_id"].to_numpy()[np.asarray(test_rows)]
    boot = PromptBootstrap.from_cfg(cfg.evaluate.bootstrap, test_prompts)
    out = ablate(
        blocks,
        frame["ratio"].to_numpy()[rows],
        split,
        float(acfg.lam),
        None if acfg.base is None else str(acfg.base),
        [float(c) for c in acfg.c_grid],
        boot.auc_interval,
    )
    counts = {"train": len(train), "val": len(val), "test": len(test_rows)}
    return {
        **out,
        "lam": float(acfg.lam),
        "rows": counts,
        "skipped": skipped,
        "seconds": time.perf_counter() - start,
    }
