"""SPRINTER Table 4: this experiment's verifiers on other experiments' test records.

A verifier reads one hidden layer of one draft, so the other records must hold the same
layer of the same draft; anything else is refused rather than scored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sprinter_train.core.classification import auc
from sprinter_train.core.rules import sampled_acceptance
from sprinter_train.evaluation.bootstrap import PromptBootstrap
from sprinter_train.evaluation.inputs import COLUMNS
from sprinter_train.evaluation.scores import verifier_scores
from sprinter_train.harvest.reader import open_records
from sprinter_train.verifier.checkpoint import VerifierCheckpoint


def transfer_report(cfg: DictConfig, verifiers: dict[str, VerifierCheckpoint]) -> dict[str, Any]:
    """Per experiment of evaluate.transfer: rows, the records' hash, each verifier's AUCs with
    intervals over the other records' test prompts."""
    out: dict[str, Any] = {}
    for other in cfg.evaluate.transfer:
        other_dir = Path(cfg.artifacts_root) / str(other)
        records = open_records(
            other_dir, columns=COLUMNS, stage="stage=evaluate (evaluate.transfer)"
        )
        for name, checkpoint in verifiers.items():
            mine = (checkpoint.meta.get("draft_model"), checkpoint.meta.get("hidden_layer"))
            theirs = (
                records.manifest.get("models", {}).get("draft", {}).get("id"),
                records.manifest["hidden"]["layer"],
            )
            if mine != theirs:
                raise ValueError(
                    f"evaluate.transfer: {name} reads hidden layer {mine[1]} of draft {mine[0]}, "
                    f"the records of {other} hold layer {theirs[1]} of {theirs[0]}"
                )
        rows = records.rows_of(str(cfg.evaluate.split))
        frame = records.frame.iloc[rows]
        y_label = frame["ratio"].to_numpy() <= 1.0
        y_event = sampled_acceptance(frame["accept_prob"].to_numpy(), int(cfg.evaluate.seed))
        scores = verifier_scores(cfg, records, rows, verifiers)
        boot = PromptBootstrap.from_cfg(cfg.evaluate.bootstrap, frame["prompt_id"].to_numpy())
        out[str(other)] = {
            "rows": len(rows),
            "prompts": boot.prompts,
            "records_manifest_sha256": records.manifest_hash,
            "auc": {n: auc(y_label, s) for n, s in scores.items()},
            "auc_ci": {n: boot.auc_interval(y_label, s) for n, s in scores.items()},
            "auc_sampled": {n: auc(y_event, s) for n, s in scores.items()},
            "auc_sampled_ci": {n: boot.auc_interval(y_event, s) for n, s in scores.items()},
        }
    return out
