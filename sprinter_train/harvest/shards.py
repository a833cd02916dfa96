"""Shard planning, atomic writing and the completeness check that makes resume exact.

Shards are fixed groups of consecutive prompts (named by group index, never by counting a
folder), so which prompts a shard holds depends only on the prompt order and the config:
a resumed run, a 1-process run and an N-process run all write the same shards. Each file
is written under a temporary name and renamed; the records parquet is written last and holds
the sha256 of the others (the sequences and each array the verifier features record,
decoding/features/table.py's `recorded_arrays()`), so a shard whose files check out is complete
and a file changed after writing is caught (on resume here, on read by harvest/reader.py).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sprinter_train.core.io import TEMP_NAME, atomic_write, corrupt_input, file_sha256
from sprinter_train.core.processes import pid_alive
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.features.table import feature_columns, recorded_arrays
from sprinter_train.harvest.continuations import HarvestSequence
from sprinter_train.harvest.records import RecordBatch
from sprinter_train.harvest.schema import (
    HIDDEN_DTYPE,
    NULLABLE,
    SCHEMA_VERSION,
    SEQUENCE_SCHEMA,
    record_schema,
)

log = logging.getLogger(__name__)

SHARD_PREFIX = "shard-"
META_FINGERPRINT = b"sprinter.fingerprint"
META_PROMPTS = b"sprinter.prompts"
META_HIDDEN_DIM = b"sprinter.hidden_dim"  # the draft hidden state's width: a verifier's d
META_SCHEMA = b"sprinter.schema_version"
FILES = ("records", "sequences")  # a shard's files besides its arrays (named by feature)
REDO = (
    "rerun `python -m sprinter_train stage=harvest experiment={exp}`, which redoes only this shard"
)

# Base columns whose range the record definitions fix (schema.py); the verifier features'
# columns declare theirs (decoding/features/table.py; column_ranges). NaN is never in range.
UNIT_COLUMNS = ("q", "p", "accept_prob", "beta", "S", "A")
NONNEGATIVE_COLUMNS = ("ratio", "draft_entropy", "target_entropy")
RANGE_SLACK = 1e-3  # float32 rounding of sums of probabilities, e.g. beta = 1 + 1e-7


@dataclass(frozen=True)
class ShardPlan:
    """Shard `index` holds these prompts, each with its mix."""

    index: int
    prompts: tuple[Prompt, ...]
    mixes: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{SHARD_PREFIX}{self.index:06d}"

    @property
    def digest(self) -> str:
        """Identifies the shard's contents: a shard of other prompts is redone, never reused."""
        text = "\n".join(
            f"{p.prompt_id}\t{m}" for p, m in zip(self.prompts, self.mixes, strict=True)
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan_shards(
    prompts: Sequence[Prompt], mixes: Sequence[str], prompts_per_shard: int
) -> list[ShardPlan]:
    step = max(1, int(prompts_per_shard))
    return [
        ShardPlan(i // step, tuple(prompts[i : i + step]), tuple(mixes[i : i + step]))
        for i in range(0, len(prompts), step)
    ]


def array_kinds() -> tuple[str, ...]:
    """The float16 (rows, width) arrays a shard holds beside its records, one `.npy` file each:
    the recorded arrays the verifier features declare, read at call time (as record_schema)."""
    kinds = tuple(recorded_arrays())
    if clash := set(kinds) & set(FILES):
        raise ValueError(f"a verifier feature's array is named like a shard file: {clash}")
    return kinds


def sha256_keys() -> dict[str, bytes]:
    """The records file's metadata key of each other file's sha256, by kind."""
    kinds = (*array_kinds(), "sequences")
    return {kind: f"sprinter.{kind}_sha256".encode() for kind in kinds}


def shard_files(records_dir: Path, name: str) -> dict[str, Path]:
    return {
        "records": records_dir / f"{name}.parquet",
        **{kind: records_dir / f"{name}.{kind}.npy" for kind in array_kinds()},
        "sequences": records_dir / f"{name}.sequences.parquet",
    }


def _record_table(batch: RecordBatch, metadata: dict[bytes, bytes]) -> pa.Table:
    schema = record_schema()
    arrays = [
        pa.array(batch.columns[f.name], type=f.type, from_pandas=f.name in NULLABLE) for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema.with_metadata(metadata))


def _sequence_table(sequences: Sequence[HarvestSequence]) -> pa.Table:
    columns = {
        "prompt_id": [s.prompt.prompt_id for s in sequences],
        "dataset": [s.prompt.dataset for s in sequences],
        "split": [s.prompt.split for s in sequences],
        "mix": [s.mix for s in sequences],
        "input_ids": [s.input_ids for s in sequences],
        "region_start": [s.region_start for s in sequences],
        "region_end": [s.region_end for s in sequences],
        "from_draft": [list(s.draft_flags) for s in sequences],
    }
    return pa.Table.from_pydict(columns, schema=SEQUENCE_SCHEMA)


def _write_parquet(path: Path, table: pa.Table) -> None:
    atomic_write(path, lambda tmp: pq.write_table(table, tmp, write_page_checksum=True))


def write_shard(
    records_dir: Path,
    plan: ShardPlan,
    batch: RecordBatch,
    sequences: Sequence[HarvestSequence],
    fingerprint: str,
) -> int:
    """Write one shard (its arrays, sequences, then records last); returns its row count."""
    files = shard_files(records_dir, plan.name)
    for kind in array_kinds():

        def _save(tmp: Path, values: np.ndarray = batch.arrays[kind]) -> None:
            with open(tmp, "wb") as handle:
                np.save(handle, np.ascontiguousarray(values, dtype=HIDDEN_DTYPE))

        atomic_write(files[kind], _save)
    _write_parquet(files["sequences"], _sequence_table(sequences))
    metadata = {
        META_FINGERPRINT: fingerprint.encode(),
        META_PROMPTS: plan.digest.encode(),
        META_HIDDEN_DIM: str(batch.arrays["hidden"].shape[1]).encode(),
        META_SCHEMA: str(SCHEMA_VERSION).encode(),
        **{key: file_sha256(files[kind]).encode() for kind, key in sha256_keys().items()},
    }
    _write_parquet(files["records"], _record_table(batch, metadata))
    return batch.rows


def shard_is_complete(
    records_dir: Path, plan: ShardPlan, fingerprint: str, dims: dict[str, int]
) -> bool:
    """True only for a whole shard of this plan and config (`dims`: the width of each of
    array_kinds()); the arrays are only mapped.

    A truncated or corrupt file, a shard of other prompts or an older config all answer
    False, and the caller redoes the shard.
    """
    files = shard_files(records_dir, plan.name)
    if not files["records"].exists():
        return False
    try:
        table = pq.read_table(files["records"], page_checksum_verification=True)
        meta = table.schema.metadata or {}
        if meta.get(META_FINGERPRINT) != fingerprint.encode():
            log.warning("%s was written with another config; redoing it", plan.name)
            return False
        if meta.get(META_PROMPTS) != plan.digest.encode():
            log.warning("%s holds other prompts than planned; redoing it", plan.name)
            return False
        if not table.schema.remove_metadata().equals(record_schema()):
            return False
        changed = [
            files[kind].name
            for kind, key in sha256_keys().items()
            if key in meta and file_sha256(files[kind]).encode() != meta[key]
        ]
        if changed:
            log.warning("%s: %s changed after writing; redoing it", plan.name, changed)
            return False
        if out_of_range(table):
            log.warning(
                "%s holds values out of range %s; redoing it", plan.name, out_of_range(table)
            )
            return False
        sequences = pq.read_table(files["sequences"], page_checksum_verification=True)
        complete = sequences.num_rows == len(plan.prompts)
        for kind in array_kinds():
            mapped = np.load(files[kind], mmap_mode="r")
            complete &= mapped.dtype == np.dtype(HIDDEN_DTYPE)
            complete &= mapped.shape == (table.num_rows, dims[kind])
    except (OSError, ValueError, EOFError, pa.ArrowException) as error:
        log.warning("%s is unreadable (%s); redoing it", plan.name, error)
        return False
    if not complete:
        log.warning(
            "%s is incomplete (its arrays or sequences do not match); redoing it", plan.name
        )
    return complete


Range = tuple[float | None, float | None, bool]  # low, high (None: unbounded), finite


def column_ranges() -> dict[str, Range]:
    """Each column with a known range: the base ones, then those the verifier features
    declare (decoding/features/table.py's Column: low, high, finite)."""
    ranges: dict[str, Range] = {name: (0.0, 1.0, False) for name in UNIT_COLUMNS}
    ranges.update({name: (0.0, None, False) for name in NONNEGATIVE_COLUMNS})
    for column in feature_columns():
        if column.low is not None or column.high is not None or column.finite:
            ranges[column.name] = (column.low, column.high, column.finite)
    return ranges


def out_of_range(table: pa.Table) -> dict[str, int]:
    """Rows per column outside the column's known range (nulls of S and A are allowed)."""
    bad = {}
    for name, (low, high, finite) in column_ranges().items():
        if name not in table.column_names:
            continue
        values = table.column(name).drop_null().to_numpy()
        ok = values == values if low is None else values >= low - RANGE_SLACK
        if high is not None:
            ok &= values <= high + RANGE_SLACK
        if finite:
            ok &= np.isfinite(values)
        if count := int((~ok).sum()):  # NaN compares False: counted
            bad[name] = count
    return bad


def read_shard_records(path: Path, columns: list[str] | None, remedy: str) -> pa.Table:
    """One shard's records, page checksums verified and known ranges checked; anything else
    is a CorruptInputError naming the file and `remedy`."""
    try:
        table = pq.read_table(path, columns=columns, page_checksum_verification=True)
    except (OSError, ValueError, pa.ArrowException) as error:
        raise corrupt_input(path, error, remedy) from error
    if bad := out_of_range(table):
        raise corrupt_input(path, f"rows out of range per column: {bad}", remedy)
    return table


def shard_hashes(records_dir: Path, name: str) -> dict[str, str]:
    """sha256 of each of a shard's files, checked against the hashes its records file holds
    from write time: an array or sequences file changed since then is an error naming it."""
    files = shard_files(records_dir, name)
    meta = pq.read_schema(files["records"]).metadata or {}
    hashes = {kind: file_sha256(path) for kind, path in files.items()}
    for kind, key in sha256_keys().items():
        if key in meta and meta[key].decode() != hashes[kind]:
            raise corrupt_input(
                files[kind],
                "its sha256 differs from the one recorded when it was written",
                REDO.format(exp=records_dir.parent.name),
            )
    return hashes


def read_records(
    records_dir: Path, names: Sequence[str], columns: list[str] | None = None
) -> pa.Table:
    """The records of the named shards, in order (manifest counts, tests, later stages)."""
    remedy = REDO.format(exp=records_dir.parent.name)
    tables = [read_shard_records(records_dir / f"{n}.parquet", columns, remedy) for n in names]
    if not tables:
        full = record_schema()
        schema = full if columns is None else pa.schema([full.field(c) for c in columns])
        return schema.empty_table()
    return pa.concat_tables([t.replace_schema_metadata(None) for t in tables])


def remove_stale_files(records_dir: Path, keep: set[str]) -> list[str]:
    """Delete shard files of no planned shard (another prompt count or split) and temp files
    left by a killed writer, so a folder glob never mixes them into this record set; a live
    writer's temporary file is never touched."""
    removed = []
    for path in sorted(records_dir.glob(f"*{SHARD_PREFIX}*")):
        if path.name.startswith("."):
            match = TEMP_NAME.match(path.name)
            if match and pid_alive(int(match.group(1))):
                continue  # a writer still at work (the stage lock keeps this rare)
        stem = path.name.split(".")[0] if not path.name.startswith(".") else ""
        if path.name.startswith(".") or stem not in keep:
            path.unlink()
            removed.append(path.name)
    if removed:
        log.warning(
            "removed %d stale shard files from %s: %s", len(removed), records_dir, removed[:5]
        )
    return removed
