"""The record schema (**contract**, DESIGN.md "Records"): fixed column types, one version number.

A shard `shard-<index>` is three files in `records/`:
  shard-<index>.parquet            one row per harvested draft token (RECORD_SCHEMA)
  shard-<index>.hidden.npy         float16 (rows, d): row i is parquet row i's draft hidden state
  shard-<index>.sequences.parquet  one row per prompt: the full token sequence and its region
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

SCHEMA_VERSION = 1
HIDDEN_DTYPE = "float16"

RECORD_SCHEMA = pa.schema(
    [
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
)
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
    ]
)

NUMPY_DTYPES: dict[str, type | np.dtype] = {
    field.name: object if pa.types.is_string(field.type) else field.type.to_pandas_dtype()
    for field in RECORD_SCHEMA
}
