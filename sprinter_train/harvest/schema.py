"""The record schema, the records' **contract**: fixed column types, one version number.

This module is where the contract lives in the repository: the columns every record has, the
verifier features' columns (decoding/features/table.py), their dtypes and `SCHEMA_VERSION`,
which every reader checks; docs/stages/harvest.md describes each column and file. (The
project's design notes, which state the same contract in prose, are kept outside this
repository, in the workspace's shared/DESIGN.md, section "Records".)

A shard `shard-<index>` is four files in `records/`:
  shard-<index>.parquet            one row per harvested draft token (record_schema())
  shard-<index>.hidden.npy         float16 (rows, d): row i is parquet row i's draft hidden state
  shard-<index>.sequences.parquet  one row per prompt: the full token sequence and its region
  shard-<index>.target_hidden.npy  float16 (rows, d_target): the target's final hidden state at
                                   row i's last target-verified position (zero where none)
The two .npy files are the arrays the verifier features declare (decoding/features/table.py's
`recorded_arrays()`, each `<shard>.<feature>.npy`): a feature that declares one adds a file.

Version 2 added the decode-time feature columns (draft_margin .. target_margin), the
target_hidden array and the sequences' `from_draft`; a folder of another version is refused
(harvest/reader.py).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sprinter_train.decoding.features.table import feature_columns

SCHEMA_VERSION = 2
HIDDEN_DTYPE = "float16"

# the columns every record has; the verifier features' own columns follow them (record_schema)
BASE_COLUMNS = [
    ("prompt_id", pa.string()),
    ("dataset", pa.string()),
    ("split", pa.string()),  # train / val / test, a hash of the prompt id (data.seed)
    ("mix", pa.string()),  # original / draft / target / interleaved
    ("position", pa.int32()),  # t: index in the sequence of the token the record is about
    ("token_id", pa.int32()),  # x ~ q_t, sampled from the warped draft distribution
    ("q", pa.float32()),  # q_t(x), warped draft probability
    ("p", pa.float32()),  # p_t(x), warped target probability
    ("ratio", pa.float32()),  # q/p, +inf where p = 0
    ("accept_prob", pa.float32()),  # min(1, p/q)
    ("beta", pa.float32()),  # sum_v min(p_t(v), q_t(v))
    ("draft_entropy", pa.float32()),  # H(q_t), nats
    ("target_entropy", pa.float32()),  # H(p_t), nats
    ("S", pa.float32()),  # SV: sum_v min(q_t(v), c_t(v)); null without a companion
    ("A", pa.float32()),  # SV: min(1, c_t(x)/q_t(x)); null without a companion
]
NULLABLE = ("S", "A")

SEQUENCE_SCHEMA = pa.schema(
    [
        ("prompt_id", pa.string()),
        ("dataset", pa.string()),
        ("split", pa.string()),
        ("mix", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("region_start", pa.int32()),  # first recorded position
        ("region_end", pa.int32()),  # one past the last recorded position
        ("from_draft", pa.list_(pa.bool_())),  # per input_ids token: sampled by the draft, kept
    ]
)


def record_schema() -> pa.Schema:
    """BASE_COLUMNS, then the decode-time feature columns decoding/features/table.py declares
    (draft_margin .. target_margin), each known at t without a target call: read at call time,
    so a feature registered later has its columns written and checked."""
    fields = [*BASE_COLUMNS]
    for column in feature_columns():
        if column.name in {name for name, _ in fields}:
            raise ValueError(f"the verifier features declare record column {column.name!r} twice")
        fields.append((column.name, pa.from_numpy_dtype(np.dtype(column.dtype))))
    return pa.schema(fields)


def numpy_dtypes() -> dict[str, type | np.dtype]:
    """Each record column's numpy dtype (object for strings), in schema order."""
    return {
        field.name: object if pa.types.is_string(field.type) else field.type.to_pandas_dtype()
        for field in record_schema()
    }
