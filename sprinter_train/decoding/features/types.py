"""The shapes of a verifier feature's declaration (feature_table.py holds the table): what an
entry says, and what the harvest and the decoder hand its recipes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from sprinter_train.decoding.batch import DraftStep, RowState

Tensor = torch.Tensor
Settings = Mapping[str, float]
WIDTHS = {  # a dense block's width, as FeatureSpec.layout is told it
    "hidden": "the draft's hidden width",
    "embedding": "the draft's embedding width",
    "target_hidden": "the target's hidden width",
}


@dataclass(frozen=True)
class AtPosition:
    """What the harvest knows at a block of recorded positions t, one row each."""

    q: Tensor  # (n, V) warped draft distribution at t
    p: Tensor  # (n, V) warped target distribution at t
    draft_logits: Tensor  # (n, V) the draft's raw logits at t
    target_logits: Tensor  # (n, V) the target's raw logits at t
    tokens: Tensor  # (n,) x ~ q, the recorded token


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
class RecordInputs:
    """What training and evaluate read of n records to build their features."""

    columns: Mapping[str, np.ndarray]
    hidden: np.ndarray | None = None  # (n, d) float16: the draft's hidden state that gave q
    target_hidden: np.ndarray | None = None  # (n, d_target) float16, where read
    embedder: Callable[[np.ndarray], np.ndarray] | None = None  # token ids -> embeddings

    def column(self, name: str) -> Tensor:
        """A record column as float32 (scalar features are float32)."""
        return torch.from_numpy(np.asarray(self.columns[name], dtype=np.float32))


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
    width: str | None = None  # a dense float16 block of this width (WIDTHS); None: a scalar
    history: bool = False  # reads the row's history (RowState), not only its draft step
    pre_draw: bool = False  # fixed before x is drawn: known from the draft's state alone

    @property
    def record_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns) if self.reads is None else self.reads

    @property
    def dense(self) -> bool:
        return self.width is not None
