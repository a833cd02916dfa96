"""SPRINTER Table 4: this experiment's verifiers on other experiments' test records.

A verifier reads one hidden layer of one draft, so the other records must hold the same
layer of the same draft (its whole identity: files' content, revision, seed) under the same
sampling; anything else is refused rather than scored. Records of the same dataset under another
data seed can hold prompts the verifier was trained on: those are refused too, or with
`evaluate.allow_train_overlap` scored and counted in the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sprinter_train.core.classification import auc
from sprinter_train.core.rules import sampled_acceptance
from sprinter_train.data.overlap import Reader
from sprinter_train.evaluation.bootstrap import PromptBootstrap
from sprinter_train.evaluation.inputs import COLUMNS
from sprinter_train.evaluation.scores import verifier_scores
from sprinter_train.harvest.reader import RecordSet, open_records
from sprinter_train.verifier.checkpoint import VerifierCheckpoint
from sprinter_train.verifier.fit_check import check_fitted_verifier


def check_transfer(
    cfg: DictConfig, other: str, records: RecordSet, verifiers: dict[str, VerifierCheckpoint]
) -> dict[str, int | None]:
    """Refuse a verifier of another draft, layer or sampling than `other`'s records; return each
    verifier's count of `other`'s evaluated prompts it was fitted on (refused unless allowed):
    the readers' one rule (verifier/fit_check.py, sv/table.py)."""
    prompts = list(records.frame["prompt_id"].iloc[records.rows_of(str(cfg.evaluate.split))])
    reader = Reader(
        f"evaluate.transfer={other}",
        prompts,
        bool(cfg.evaluate.get("allow_train_overlap", False)),
        "evaluate.allow_train_overlap",
        str(cfg.experiment),
    )
    draft = records.manifest.get("models", {}).get("draft")
    layer = records.manifest["hidden"]["layer"]
    remedy = f"transfer to records of other prompts (another dataset, or {other}'s data.seed)"
    return {
        name: check_fitted_verifier(
            checkpoint, reader, draft, records.manifest.get("sampling") or {}, remedy, layer
        )
        for name, checkpoint in verifiers.items()
    }


def transfer_report(cfg: DictConfig, verifiers: dict[str, VerifierCheckpoint]) -> dict[str, Any]:
    """Per experiment of evaluate.transfer: rows, the records' hash, each verifier's AUCs with
    intervals over the other records' test prompts."""
    out: dict[str, Any] = {}
    for other in cfg.evaluate.transfer:
        other_dir = Path(cfg.artifacts_root) / str(other)
        needed = [c for v in verifiers.values() for c in v.spec.record_columns()]
        records = open_records(  # the columns the verifiers' features read, too
            other_dir,
            columns=list(dict.fromkeys([*COLUMNS, *needed])),
            stage="stage=evaluate (evaluate.transfer)",
        )
        overlap = check_transfer(cfg, str(other), records, verifiers)
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
            "train_overlap": overlap,
            "auc": {n: auc(y_label, s) for n, s in scores.items()},
            "auc_ci": {n: boot.auc_interval(y_label, s) for n, s in scores.items()},
            "auc_sampled": {n: auc(y_event, s) for n, s in scores.items()},
            "auc_sampled_ci": {n: boot.auc_interval(y_event, s) for n, s in scores.items()},
        }
    return out
