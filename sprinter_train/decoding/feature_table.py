"""The verifier's features, each declared once in FEATURES (SPRINTER §3.2's s(x, prefix) and
the extra decode-time inputs), so a feature cannot mean one thing to the harvest and another
to the decoder.

An entry (`Feature`) says
- how the harvest records it: the record columns it adds to the schema (`Column`: name,
  dtype, known range, and the recipe that fills it from a block's distributions or from the
  sequence's history), or the columns and arrays it reads that the harvest writes anyway;
- how training reads it back from records (`from_records`, on `RecordInputs`);
- how the decoder computes it for a drafted token (`at_decode`, on `DecodeInputs`: the draft
  step and the row's `RowState`), with the same helpers, so both see the same numbers;
- the settings it needs (stored in the verifier's sidecar), whether it is a float16 dense block
  and of which width, whether it reads the row's history, whether it is fixed before x is
  drawn.

Every other place reads this table: the record schema and its range checks
(harvest/schema.py, harvest/shards.py), the harvest's columns (harvest/records.py), the feature
vector of training, evaluate and decoding (verifier/features.py, verifier/scorer.py), whether
the engine keeps the row state (decoding/state.py) and sd_learned's draw rule
(decoding/policies/learned.py). Adding a feature is one `register` call (or one entry below)
plus its test; docs/architecture.md, "Adding a verifier feature", says how.

This module imports no pyarrow: an export folder carries the decoder's modules with torch and
numpy only (hf/vendor.py), so column dtypes are numpy names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from sprinter_train.core.distributions import entropy, raw_entropy, top2_margin

if TYPE_CHECKING:
    from sprinter_train.decoding.state import DraftStep, RowState

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


def smoothed_acceptance(accepted: Tensor, drafts: Tensor, prior: float, n0: float) -> Tensor:
    """(accepted + n0 * prior) / (drafts + n0): a row's acceptance so far, pulled toward
    `prior` while it has few drafts (a Beta(n0 * prior, n0 * (1 - prior)) prior's mean).

    Decoding and training estimate the same quantity, the row's mean acceptance of its
    earlier drafts, from different counts: the decoder counts the drafts it proposed in
    earlier rounds and those kept as drawn (accepted by the target's check or trusted by a
    verifier), so drafts of the current round are not in it yet; records count every earlier
    recorded position of the sequence (each one a draft x ~ q) with its expected acceptance
    min(1, p/q) in place of a 0/1 outcome."""
    return (accepted.float() + n0 * prior) / (drafts.float() + n0)


def clipped_run(run: Tensor, cap: int) -> Tensor:
    """The run position as the verifier sees it, float32 in [0, cap]: records and decoding
    clip at the same sidecar value, so neither meets a range the other never had."""
    return run.clamp(min=0, max=cap).float()


def _array(kind: str, what: str) -> Callable[[RecordInputs, Settings], Tensor]:
    """A float16 array beside the records (`kind`: RecordInputs.hidden or .target_hidden)."""

    def read(records: RecordInputs, settings: Settings) -> Tensor:
        values = getattr(records, kind)
        if values is None:
            raise ValueError(f"the {kind} feature needs the records' {what}")
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float16))

    return read


def _embedded(records: RecordInputs, settings: Settings) -> Tensor:
    if records.embedder is None:
        raise ValueError("the token_embedding feature needs the draft model's embedding")
    emb = records.embedder(np.asarray(records.columns["token_id"], dtype=np.int64))
    return torch.from_numpy(np.ascontiguousarray(emb, dtype=np.float32))


def _column(name: str) -> Callable[[RecordInputs, Settings], Tensor]:
    return lambda records, settings: records.column(name)


def _drafted_q(inputs: DecodeInputs, settings: Settings) -> Tensor:
    step = inputs.step
    return step.q.gather(1, step.tokens[:, None])[:, 0].float()


def _accepted_before(history: SequenceHistory) -> np.ndarray:
    """The sum of accept_prob over the sequence's earlier records (float64 sums)."""
    earlier = np.concatenate([[0.0], np.cumsum(history.accept_prob, dtype=np.float64)[:-1]])
    return earlier.astype(np.float32)


FEATURES: dict[str, Feature] = {}


def register(feature: Feature) -> Feature:
    """Declare `feature` (after those declared): its name and columns must be new, and each of
    its columns has exactly one recipe. Record columns outside this table (harvest/schema.py's
    base columns) are not known here: harvest/schema.py refuses a clash when it builds the
    schema."""
    if feature.name in FEATURES:
        raise ValueError(f"a verifier feature named {feature.name!r} is already declared")
    taken = {c.name for f in FEATURES.values() for c in f.columns}
    for column in feature.columns:
        if column.name in taken:
            raise ValueError(f"record column {column.name!r} is already declared")
        if (column.at_position is None) == (column.per_sequence is None):
            raise ValueError(f"record column {column.name!r} needs one recipe")
        if column.at_last_verified and column.at_position is None:
            raise ValueError(f"record column {column.name!r}: at_last_verified needs at_position")
    if feature.width is not None and feature.width not in WIDTHS:
        raise ValueError(f"feature {feature.name!r}: width is one of {sorted(WIDTHS)}")
    FEATURES[feature.name] = feature
    return feature


def feature_order() -> tuple[str, ...]:
    """The vector's layout: dense blocks first, then scalars, each in declaration order, so a
    checkpoint's sidecar (names and settings) fully describes the vector a decoder builds."""
    dense = [f.name for f in FEATURES.values() if f.dense]
    return (*dense, *(f.name for f in FEATURES.values() if not f.dense))


def dense_features() -> tuple[str, ...]:
    return tuple(f.name for f in FEATURES.values() if f.dense)


def history_features() -> frozenset[str]:
    """Features read from a row's history (`RowState`), not from its draft step."""
    return frozenset(f.name for f in FEATURES.values() if f.history)


def pre_draw_features() -> frozenset[str]:
    """Features fixed before the drafted token x is drawn."""
    return frozenset(f.name for f in FEATURES.values() if f.pre_draw)


def feature_columns() -> tuple[Column, ...]:
    """The record columns the features add, in schema order (declaration order)."""
    return tuple(c for f in FEATURES.values() for c in f.columns)


def _declare_builtin() -> None:
    """The built-in features, in the record schema's and the vector's order."""
    register(
        Feature(
            "hidden",
            "the draft's hidden state that produced q (the record's `hidden` array at t - 1)",
            from_records=_array("hidden", "hidden states"),
            at_decode=lambda inputs, settings: inputs.step.hidden,
            reads=(),
            width="hidden",
            pre_draw=True,
        )
    )
    register(
        Feature(
            "token_embedding",
            "the draft's input embedding of the drafted token x",
            from_records=_embedded,
            at_decode=lambda inputs, settings: inputs.embedding(inputs.step.tokens),
            reads=("token_id",),
            width="embedding",
        )
    )
    register(
        Feature(
            "target_hidden",
            "the target's final hidden state at the row's last target-verified position: for a"
            " draft at t with run position r, the target's state at t - r - 2 (decoding/"
            "state.py's RowState says why; zero where the target verified nothing of the row)",
            from_records=_array("target_hidden", "target hidden states"),
            at_decode=lambda inputs, settings: inputs.row.target_hidden,
            reads=(),
            width="target_hidden",
            history=True,
        )
    )
    register(
        Feature(
            "q",
            "q(x), the drafted token's warped draft probability (the record's `q`)",
            from_records=_column("q"),
            at_decode=_drafted_q,
            reads=("q",),
        )
    )
    register(
        Feature(
            "draft_entropy",
            "H(q) of the warped draft distribution, nats (the record's `draft_entropy`)",
            from_records=_column("draft_entropy"),
            at_decode=lambda inputs, settings: entropy(inputs.step.q.float()),
            reads=("draft_entropy",),
            pre_draw=True,
        )
    )
    register(
        Feature(
            "draft_margin",
            "the draft's raw logit top-1 minus top-2 at the position (vLLM's online acceptance"
            " estimator)",
            from_records=_column("draft_margin"),
            at_decode=lambda inputs, settings: top2_margin(inputs.step.head_logits),
            columns=(
                Column(
                    "draft_margin",
                    "raw draft logits at t: top-1 minus top-2",
                    low=0.0,
                    at_position=lambda at: top2_margin(at.draft_logits),
                ),
            ),
        )
    )
    register(
        Feature(
            "draft_entropy_raw",
            "H(softmax(raw draft logits)), nats, whatever sampling warps q with",
            from_records=_column("draft_entropy_raw"),
            at_decode=lambda inputs, settings: raw_entropy(inputs.step.head_logits),
            columns=(
                Column(
                    "draft_entropy_raw",
                    "H(softmax(raw draft logits at t)), nats",
                    low=0.0,
                    at_position=lambda at: raw_entropy(at.draft_logits),
                ),
            ),
        )
    )
    register(
        Feature(
            "run_position",
            "how many draft-made tokens stand right before the position (at decode: the row's"
            " run at the round's start plus the draft's index in the round), clipped at the"
            " sidecar's `run_position_cap`",
            from_records=lambda records, settings: clipped_run(
                records.column("run_position"), int(settings["run_position_cap"])
            ),
            at_decode=lambda inputs, settings: clipped_run(
                inputs.row.run + inputs.step.index, int(settings["run_position_cap"])
            ),
            columns=(
                Column(
                    "run_position",
                    "consecutive draft-made tokens right before t",
                    dtype="int32",
                    low=0.0,
                    per_sequence=lambda history: history.runs,
                ),
            ),
            settings=("run_position_cap",),
            history=True,
        )
    )
    register(
        Feature(
            "accept_so_far",
            "the row's acceptance so far, Beta-smoothed (`smoothed_acceptance`)",
            from_records=lambda records, settings: smoothed_acceptance(
                records.column("accepted_before"),
                records.column("drafts_before"),
                settings["accept_prior"],
                settings["accept_n0"],
            ),
            at_decode=lambda inputs, settings: smoothed_acceptance(
                inputs.row.accepted,
                inputs.row.drafted,
                settings["accept_prior"],
                settings["accept_n0"],
            ),
            columns=(
                Column(
                    "accepted_before",
                    "sum of accept_prob over this sequence's earlier records",
                    low=0.0,
                    per_sequence=_accepted_before,
                ),
                Column(
                    "drafts_before",
                    "how many earlier records this sequence has",
                    dtype="int32",
                    low=0.0,
                    per_sequence=lambda history: np.arange(len(history.runs), dtype=np.int32),
                ),
            ),
            settings=("accept_prior", "accept_n0"),
            history=True,
        )
    )
    register(
        Feature(
            "target_margin",
            "the target's raw top-2 logit margin at the row's last target-verified position"
            " (as target_hidden's)",
            from_records=_column("target_margin"),
            at_decode=lambda inputs, settings: inputs.row.target_margin,
            columns=(
                Column(
                    "target_margin",
                    "raw target top-1 - top-2 at t - run_position - 2",
                    low=0.0,
                    at_position=lambda at: top2_margin(at.target_logits),
                    at_last_verified=True,
                ),
            ),
            history=True,
        )
    )


_declare_builtin()
