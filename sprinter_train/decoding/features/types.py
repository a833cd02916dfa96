"""The shapes of a verifier feature's declaration (feature_table.py holds the table): what an
entry says, and what the harvest and the decoder hand its recipes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from sprinter_train.decoding.batch import DraftStep, RowState
    from sprinter_train.models.roles import Roles

Tensor = torch.Tensor
Settings = Mapping[str, float]
# the dense widths no harvested array gives (a recorded feature's width is its array's, named
# by the feature: `Array`), as FeatureSpec.layout is told them
WIDTHS = {"embedding": "the draft's embedding width"}


@dataclass(frozen=True)
class AtPosition:
    """What the harvest knows at a block of recorded positions t, one row each."""

    q: Tensor  # (n, V) warped draft distribution at t
    p: Tensor  # (n, V) warped target distribution at t
    draft_logits: Tensor  # (n, V) the draft's raw logits at t
    target_logits: Tensor  # (n, V) the target's raw logits at t
    tokens: Tensor  # (n,) x ~ q, the recorded token
    draft_hidden: Tensor  # (n, d) the draft's state at harvest.hidden_layer (read at t - 1)
    target_final: Tensor  # (n, d_target) the target's final hidden state (read at t - 1)


@dataclass(frozen=True)
class SequenceHistory:
    """One harvested sequence's records, in order, and what came before each."""

    runs: np.ndarray  # (n,) int32: draft-made tokens right before each record's position
    accept_prob: np.ndarray  # (n,) float32: each record's min(1, p/q)


@dataclass(frozen=True)
class Column:
    """A record column a feature adds to the schema, and how the harvest fills it.

    `dtype`: a numpy name (the parquet type follows it); `low` / `high` / `finite`: its known
    range, checked on every write and read (NaN is never in range). Exactly one recipe:
    `at_position` from a block's distributions, or `per_sequence` from the sequence's history.
    `at_last_verified`: the record holds the `at_position` value of its last target-verified
    position (0 where the target verified none of the row), the state a decoder holds then."""

    name: str
    doc: str
    dtype: str = "float32"
    low: float | None = None
    high: float | None = None
    finite: bool = False
    at_position: Callable[[AtPosition], Tensor] | None = None
    per_sequence: Callable[[SequenceHistory], np.ndarray] | None = None
    at_last_verified: bool = False


@dataclass(frozen=True)
class Array:
    """A dense feature the harvest records: a float16 (rows, width) array beside each shard's
    records, `<shard>.<feature>.npy` with row i = parquet row i, described in the manifest
    under the feature's name (`d`: its width). Declared here so that the shard files, their
    hashes, the reader's kinds, the manifest and the harvest's arrays all follow the table.

    `at_position` fills it from a block of recorded positions, as a Column's does;
    `at_last_verified`: a record holds the row of its last target-verified position (zero where
    the target verified none of the row). `width_of`: its width from the harvest's models;
    `width`: that width in words; `note`: what a row is, beside the file in the manifest;
    `about`: further keys of its manifest section, from the harvest's content settings."""

    width: str
    width_of: Callable[[Roles], int]
    at_position: Callable[[AtPosition], Tensor]
    at_last_verified: bool = False
    note: str = ""
    about: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None


@dataclass(frozen=True)
class RecordInputs:
    """What training and evaluate read of n records to build their features: the columns,
    and the recorded arrays (float16 (n, width), by feature name) the features read."""

    columns: Mapping[str, np.ndarray]
    arrays: Mapping[str, np.ndarray]
    embedder: Callable[[np.ndarray], np.ndarray] | None = None  # token ids -> embeddings

    def column(self, name: str) -> Tensor:
        """A record column as float32 (scalar features are float32)."""
        return torch.from_numpy(np.asarray(self.columns[name], dtype=np.float32))

    def array(self, name: str) -> Tensor:
        """A recorded array as the float16 tensor it was stored as."""
        if name not in self.arrays:
            raise ValueError(f"the {name} feature needs the records' {name} array")
        return torch.from_numpy(np.ascontiguousarray(self.arrays[name], dtype=np.float16))


@dataclass(frozen=True)
class DecodeInputs:
    """What the decoder knows when it scores each row's drafted token."""

    step: DraftStep
    state: RowState | None
    embedding: Callable[[Tensor], Tensor]  # the draft's input embedding

    @property
    def row(self) -> RowState:
        """The batch's row state (a history feature is refused without one, by the scorer)."""
        assert self.state is not None
        return self.state


@dataclass(frozen=True)
class Feature:
    """One verifier input, declared once (see the module docstring)."""

    name: str
    doc: str
    from_records: Callable[[RecordInputs, Settings], Tensor]
    at_decode: Callable[[DecodeInputs, Settings], Tensor]
    columns: tuple[Column, ...] = ()  # record columns this feature adds to the schema
    reads: tuple[str, ...] | None = None  # record columns it reads; None: its own `columns`
    settings: tuple[str, ...] = ()  # sidecar settings it needs (train.feature_settings)
    # a dense float16 block of this width (WIDTHS); None: a scalar, or its `array`'s width
    width: str | None = None
    array: Array | None = None  # a dense block the harvest records (its width: the name)
    # the RowState fields it reads of the row's history (none: its draft step alone); a
    # draft round scored in the draft's graph hands the graph these alone
    row_fields: tuple[str, ...] = ()
    pre_draw: bool = False  # fixed before x is drawn: known from the draft's state alone

    def __post_init__(self) -> None:
        """A recorded feature's width is named by the feature, the key every reader of the
        array (shard files, manifest, RecordInputs.arrays, FeatureSpec.layout) uses."""
        if self.array is not None and self.width is None:
            object.__setattr__(self, "width", self.name)

    @property
    def record_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns) if self.reads is None else self.reads

    @property
    def dense(self) -> bool:
        return self.width is not None

    @property
    def history(self) -> bool:
        """Whether it reads the row's history (RowState), not only its draft step."""
        return bool(self.row_fields)
