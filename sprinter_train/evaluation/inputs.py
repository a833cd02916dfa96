"""What stage=evaluate reads (records, verifiers, SV table) and the provenance it reports.

Each input is checked on entry, so a missing one names the stage that makes it, and against
the readers' one rule (verifier/fit_check.py, sv/table.py): a verifier or table of other models, or fitted on
prompts evaluate scores, is refused. The report's `inputs` section says whether each was
fitted on these very records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from omegaconf import DictConfig

from sprinter_train.core.io import corrupt_input
from sprinter_train.data.overlap import Reader, overlapping
from sprinter_train.decoding.features.table import FEATURES
from sprinter_train.evaluation.scores import record_scores
from sprinter_train.harvest.reader import (
    RecordSet,
    file_sha256,
    open_records,
    records_dir_of,
    verify_hashes,
)
from sprinter_train.harvest.shards import shard_files
from sprinter_train.sv.table import SVTable, check_fitted_table
from sprinter_train.verifier.checkpoint import (
    VerifierCheckpoint,
    lam_name,
    load_verifier,
    sidecar_path,
    train_command,
    verifier_path,
)
from sprinter_train.verifier.fit_check import check_fitted_verifier
from sprinter_train.verifier.labels import ACCEPT_NAME, Label, trained_lams

COLUMNS = [
    "prompt_id",
    "split",
    "mix",
    "position",
    "token_id",
    "q",
    "ratio",
    "accept_prob",
    "beta",
    "draft_entropy",
    "S",
    "A",
]


def shard_columns(experiment_dir: str | Path) -> set[str] | None:
    """The record columns of the set's first shard (None when it cannot be read: open_records
    then says why). Records harvested before a column was added lack it."""
    records_dir = records_dir_of(experiment_dir)
    try:
        manifest = json.loads((records_dir / "manifest.json").read_text())
        first = manifest["shards"][0]["name"]
        return set(pq.read_schema(shard_files(records_dir, first)["records"]).names)
    except (OSError, ValueError, KeyError, IndexError, TypeError, pa.ArrowException):
        return None


def record_columns(cfg: DictConfig) -> list[str]:
    """COLUMNS, and those the feature groups (evaluate.ablation) and the record scores of
    `cfg.methods` read, where the records have them: a record score or a group whose column
    is missing is left out of the report, not an error."""
    extra = [c for feature in FEATURES.values() for c in feature.record_columns]
    extra += [c for score in record_scores(cfg).values() for c in (*score.columns, *score.optional)]
    present = shard_columns(cfg.experiment_dir)
    wanted = [c for c in dict.fromkeys(extra) if c not in COLUMNS]
    return COLUMNS + [c for c in wanted if present is not None and c in present]


def table_path(cfg: DictConfig) -> Path:
    return Path(cfg.experiment_dir) / "tables" / "sv_table.json"


def evaluated_lams(cfg: DictConfig) -> list[float]:
    """evaluate.lams, else (null) the λs stage=train trains with these settings."""
    if cfg.evaluate.get("lams") is not None:
        return [float(lam) for lam in cfg.evaluate.lams]
    return trained_lams(cfg.train)


def load_inputs(cfg: DictConfig) -> tuple[RecordSet, dict[str, VerifierCheckpoint], SVTable | None]:
    """Records, verifiers and table, each checked on entry (errors name the stage to run);
    the soft-label verifier joins the λ ones when it was trained."""
    records = open_records(
        cfg.experiment_dir,
        columns=record_columns(cfg),
        stage="stage=evaluate",
        verify=verify_hashes(cfg),
    )
    verifiers = {
        f"verifier_lam{lam_name(lam)}": load_verifier(
            verifier_path(cfg.checkpoint_dir, float(lam)), str(cfg.experiment)
        )
        for lam in evaluated_lams(cfg)
    }
    accept = verifier_path(cfg.checkpoint_dir, Label("accept_prob"))
    if accept.exists():
        verifiers[f"verifier_{ACCEPT_NAME}"] = load_verifier(accept, str(cfg.experiment))
    for name in list(verifiers):  # train.head=mlp's verifiers, beside the linear ones
        label = (
            Label("accept_prob")
            if name.endswith(ACCEPT_NAME)
            else Label("ratio", float(verifiers[name].meta["lam"]))
        )
        mlp = verifier_path(cfg.checkpoint_dir, label, "mlp")
        if mlp.exists():
            verifiers[f"{name}_mlp"] = load_verifier(mlp, str(cfg.experiment))
    for checkpoint in verifiers.values():  # the report says what each was trained on
        if not isinstance(checkpoint.meta.get("records"), dict):
            raise corrupt_input(
                sidecar_path(checkpoint.path),
                "no records (the record set it was trained on)",
                f"train it again with `python -m sprinter_train stage=train "
                f"experiment={cfg.experiment}`",
            )
    table = SVTable.load(table_path(cfg)) if records.has_companion else None
    check_fitted(cfg, records, verifiers, table)
    return records, verifiers, table


def evaluate_reader(cfg: DictConfig, records: RecordSet) -> Reader:
    """stage=evaluate as a reader of fitted artifacts: it scores the prompts of
    evaluate.split, and evaluate.allow_train_overlap lets it score ones they were fitted on."""
    rows = records.rows_of(str(cfg.evaluate.split))
    return Reader(
        "stage=evaluate",
        [str(p) for p in records.frame["prompt_id"].iloc[rows].unique()],
        bool(cfg.evaluate.get("allow_train_overlap", False)),
        "evaluate.allow_train_overlap",
        str(cfg.experiment),
    )


def check_fitted(
    cfg: DictConfig,
    records: RecordSet,
    verifiers: dict[str, VerifierCheckpoint],
    table: SVTable | None,
) -> dict[str, int | None]:
    """The readers' one rule (verifier/fit_check.py, sv/table.py) on evaluate's inputs: each verifier and the
    table fits the records' models, sampling and hidden layer, and none was fitted on the
    prompts scored (a verifier trained on records of another data seed can hold them);
    returns each one's overlap count (None: unknown)."""
    reader = evaluate_reader(cfg, records)
    models = records.manifest.get("models") or {}
    sampling = records.manifest.get("sampling") or {}
    layer = (records.manifest.get("hidden") or {}).get("layer")
    experiment = str(cfg.experiment)
    counts: dict[str, int | None] = {}
    for name, checkpoint in verifiers.items():
        remedy = (
            f"evaluate it on the records it was trained on, or retrain it on these "
            f"({train_command(checkpoint.path, experiment)})"
        )
        counts[name] = check_fitted_verifier(
            checkpoint, reader, models.get("draft"), sampling, remedy, layer
        )
    if table is not None:
        remedy = (
            "refit it on these records "
            f"(`python -m sprinter_train stage=tables experiment={experiment}`)"
        )
        counts["sv_table"] = check_fitted_table(
            table, table_path(cfg), reader, models or None, remedy
        )
    return counts


def input_provenance(
    cfg: DictConfig,
    records: RecordSet,
    verifiers: dict[str, VerifierCheckpoint],
    table: SVTable | None,
) -> dict[str, Any]:
    """Where each input came from, whether it was fitted on this record set, and how many of
    the scored prompts it was fitted on (`train_overlap`; nonzero only under
    evaluate.allow_train_overlap, None: its file does not say)."""
    reader = evaluate_reader(cfg, records)
    fitted = {
        n: overlapping(c.meta.get("fitted_prompts"), reader.prompt_ids or [])
        for n, c in verifiers.items()
    }
    return {
        "records": {"dir": str(records.records_dir), "manifest_sha256": records.manifest_hash},
        "verifiers": {
            n: {
                "path": str(c.path),
                "sha256": file_sha256(c.path)[:16],
                "trained_on_this_record_set": c.meta["records"].get("content_id")
                == records.content_id,
                "train_overlap": fitted[n],
            }
            for n, c in verifiers.items()
        },
        "sv_table": None
        if table is None
        else {
            "path": str(table_path(cfg)),
            "binning": table.binning.name,
            "records_manifest_sha256": table.meta["records"]["manifest_sha256"],
            "fitted_on_this_record_set": table.meta["records"].get("content_id")
            == records.content_id,
            "train_overlap": overlapping(table.meta.get("fitted_prompts"), reader.prompt_ids or []),
        },
    }


def stale_input_notes(inputs: dict[str, Any]) -> list[str]:
    """A note per input fitted on another record set, naming the stage to rerun."""
    notes = [
        f"{name} was trained on another record set: rerun stage=train"
        + _overlap_note(meta.get("train_overlap"))
        for name, meta in inputs["verifiers"].items()
        if not meta["trained_on_this_record_set"]
    ]
    table = inputs["sv_table"]
    if table is not None and not table["fitted_on_this_record_set"]:
        notes.append(
            "the SV table was fitted on another record set: rerun stage=tables"
            + _overlap_note(table.get("train_overlap"))
        )
    return notes


def _overlap_note(count: int | None) -> str:
    """What a note adds when evaluate.allow_train_overlap scored prompts it was fitted on."""
    if not count:
        return ""
    return (
        f" ({count} of the scored prompts were among its fitted ones: evaluate.allow_train_overlap)"
    )
