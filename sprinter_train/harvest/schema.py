"""The record schema (**contract**, DESIGN.md "Records"): fixed column types, one version number.

A shard `shard-<index>` is four files in `records/`:
  shard-<index>.parquet            one row per harvested draft token (RECORD_SCHEMA)
  shard-<index>.hidden.npy         float16 (rows, d): row i is parquet row i's draft hidden state
  shard-<index>.sequences.parquet  one row per prompt: the full token sequence and its region
  shard-<index>.target_hidden.npy  float16 (rows, d_target): the target's final hidden state at
                                   row i's last target-verified position (zero where none)

Version 2 added the decode-time feature columns (draft_margin .. target_margin), the
target_hidden array and the sequences' `from_draft`; a folder of another version is refused
(harvest/reader.py).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

SCHEMA_VERSION = 2
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
        # decode-time features (verifier/features.py), each known at t without a target call
        ("draft_margin", pa.float32()),  # raw draft logits at t: top-1 minus top-2
        ("draft_entropy_raw", pa.float32()),  # H(softmax(raw draft logits at t)), nats
        ("run_position", pa.int32()),  # consecutive draft-made tokens right before t
        (
            "accepted_before",
            pa.float32(),
        ),  # sum of accept_prob over this sequence's earlier records
        ("drafts_before", pa.int32()),  # how many earlier records this sequence has
        ("target_margin", pa.float32()),  # raw target top-1 - top-2 at t - run_position - 2
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
        ("from_draft", pa.list_(pa.bool_())),  # per input_ids token: sampled by the draft, kept
    ]
)

NUMPY_DTYPES: dict[str, type | np.dtype] = {
    field.name: object if pa.types.is_string(field.type) else field.type.to_pandas_dtype()
    for field in RECORD_SCHEMA
}
