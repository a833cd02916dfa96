"""train.learning_curve: verifiers fitted on nested fractions of the train prompts, scored
on the same val and test rows, to tell whether more records would still raise the AUC."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from sprinter_train.harvest.reader import RecordSet
from sprinter_train.verifier.features import DraftEmbedder, FeatureSpec
from sprinter_train.verifier.fit import fit_verifier
from sprinter_train.verifier.labels import Label


def learning_curve(
    cfg: DictConfig,
    records: RecordSet,
    label: Label,
    spec: FeatureSpec,
    embedder: DraftEmbedder | None,
    fractions: list[float],
    full: dict[str, Any],
) -> list[dict[str, Any]]:
    """Val/test AUC of verifiers fitted on nested fractions of the train prompts (the same
    val and test rows): whether more records would still raise the AUC, measured."""
    points = []
    for fraction in sorted(f for f in fractions if 0 < f < 1):
        subset = records.with_train_prompts(fraction, int(cfg.train.seed))
        if len(subset.rows_of("train")) == 0:
            continue
        name = f"{label.name}/curve-{fraction:g}"
        fit = fit_verifier(cfg, subset, label, spec, embedder, name)
        points.append(curve_point(fraction, subset, fit.metrics))
    points.append(curve_point(1.0, records, full))
    return points


def curve_point(fraction: float, records: RecordSet, metrics: dict[str, Any]) -> dict[str, Any]:
    train = records.rows_of("train")
    return {
        "fraction": fraction,
        "train_rows": int(len(train)),
        "train_prompts": int(records.frame["prompt_id"].iloc[train].nunique())
        if "prompt_id" in records.frame
        else None,
        "val_auc_q_le_p": (metrics.get("val") or {}).get("auc_q_le_p"),
        "test_auc_q_le_p": (metrics.get("test") or {}).get("auc_q_le_p"),
        "epochs_run": metrics["epochs_run"],
        "fit_seconds": metrics["fit_seconds"],
        "selected": metrics.get("selected"),
    }
