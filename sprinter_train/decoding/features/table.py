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
  drawn. A dense block the harvest records (`Array`: its width, the recipe that fills it) is
  declared by its entry too, of any width: the array is named by the feature.

Every other place reads this table: the record schema and its range checks
(harvest/schema.py, harvest/shards.py), the harvest's columns and arrays (harvest/records.py),
the shard files, their hashes and the manifest's sections (harvest/shards.py,
harvest/manifest.py), the reader's arrays (harvest/reader.py), the feature vector of training,
evaluate and decoding (verifier/features.py, verifier/data.py, verifier/scorer.py), whether
the engine keeps the row state (decoding/batch.py) and sd_learned's draw rule
(decoding/policies/learned.py). Adding a feature is one `register` call (or one entry in
builtins.py) plus its test; docs/architecture.md, "Adding a verifier feature", says how.

This module imports no pyarrow: an export folder carries the decoder's modules with torch and
numpy only (hf/vendor.py), so column dtypes are numpy names.
"""

from __future__ import annotations

from sprinter_train.decoding.features.builtins import builtin_features
from sprinter_train.decoding.features.types import (
    WIDTHS,
    Array,
    AtPosition,
    Column,
    DecodeInputs,
    Feature,
    RecordInputs,
    SequenceHistory,
    Settings,
    Tensor,
)

__all__ = [
    "FEATURES",
    "Array",
    "AtPosition",
    "Column",
    "DecodeInputs",
    "Feature",
    "RecordInputs",
    "SequenceHistory",
    "Settings",
    "Tensor",
    "register",
]

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
    if feature.array is not None and feature.width != feature.name:
        raise ValueError(f"feature {feature.name!r}: a recorded array's width is its name")
    if feature.array is None and feature.width is not None and feature.width not in WIDTHS:
        raise ValueError(
            f"feature {feature.name!r}: width is one of {sorted(WIDTHS)}, or give it an array"
        )
    if feature.array is not None and feature.name in WIDTHS:
        raise ValueError(f"feature {feature.name!r}: its array would shadow a width of WIDTHS")
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


def recorded_arrays() -> dict[str, Array]:
    """The arrays the harvest writes beside the records, by feature name, in declaration
    order (the shard's files, hashes and manifest sections follow it). Read at call time, so
    a feature registered later has its array written, hashed and read."""
    return {f.name: f.array for f in FEATURES.values() if f.array is not None}


def dense_widths() -> dict[str, str]:
    """Every dense width a feature may have, in words: WIDTHS and each recorded array's."""
    return {**WIDTHS, **{name: array.width for name, array in recorded_arrays().items()}}


for _feature in builtin_features():
    register(_feature)
