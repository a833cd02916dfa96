"""What the verifier sees: SPRINTER §3.2's s(x, prefix), by default the draft's hidden state,
and the extra inputs of decoding/features/table.py's FEATURES (for ablations and the decode-time
length policies), each known when the draft is scored, without a target call.

The feature vector's layout is fixed by the table's `feature_order()` (dense blocks first)
whatever order the config lists them in, so a checkpoint's sidecar (names, layout and
`settings`) fully describes the vector a decoder must build. `assemble` puts the parts together
for training (from records, `build_features`) and for decoding (verifier/scorer.py), each part
computed by its feature's own entry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sprinter_train.core.half import as_record_half
from sprinter_train.decoding.features.table import (
    FEATURES,
    RecordInputs,
    dense_features,
    dense_widths,
    feature_order,
    recorded_arrays,
)

Embedder = Callable[[np.ndarray], np.ndarray]  # token ids -> (n, e) float embeddings


@dataclass(frozen=True)
class FeatureSpec:
    """Which inputs the verifier takes, in the table's feature_order(), and the settings some
    of them need (each feature's declared `settings`: the run position's cap, the acceptance's
    prior and weight)."""

    names: tuple[str, ...] = ("hidden",)
    settings: tuple[tuple[str, float], ...] = ()

    @classmethod
    def from_names(
        cls, names: Sequence[str], settings: Mapping[str, Any] | None = None
    ) -> FeatureSpec:
        order = feature_order()
        unknown = sorted(set(names) - set(order))
        if unknown or not names:
            raise ValueError(
                f"train.features must list some of {', '.join(order)}; got {list(names)}"
            )
        ordered = tuple(n for n in order if n in set(names))
        needed = sorted({key for n in ordered for key in FEATURES[n].settings})
        given = dict(settings or {})
        missing = [key for key in needed if given.get(key) is None]
        if missing:
            raise ValueError(
                f"verifier features {[n for n in ordered if FEATURES[n].settings]} need the "
                f"settings {missing} (train.feature_settings)"
            )
        return cls(ordered, tuple((key, float(given[key])) for key in needed))

    @classmethod
    def from_cfg(cls, tcfg: Any) -> FeatureSpec:
        """train.features with train.feature_settings."""
        settings = tcfg.get("feature_settings") or {}
        return cls.from_names(list(tcfg.features), dict(settings))

    def setting(self, key: str) -> float:
        return dict(self.settings)[key]

    @property
    def dense(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n in dense_features())

    @property
    def scalars(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n not in dense_features())

    @property
    def widths(self) -> frozenset[str]:
        """The dense widths its features read (the table's dense_widths(): which recorded
        array, or the draft's embedding, a reader must load)."""
        return frozenset(w for n in self.names if (w := FEATURES[n].width) is not None)

    @property
    def arrays(self) -> tuple[str, ...]:
        """The recorded arrays its features read (by feature name), in vector order."""
        recorded = recorded_arrays()
        return tuple(n for n in self.names if n in recorded)

    def record_columns(self) -> list[str]:
        """Record columns the features read besides the recorded arrays (scalars' first)."""
        columns = [c for n in (*self.scalars, *self.dense) for c in FEATURES[n].record_columns]
        return list(dict.fromkeys(columns))

    def describe(self) -> dict[str, Any]:
        """The sidecar's `settings` (an empty dict when no feature needs one)."""
        return dict(self.settings)

    def layout(
        self, d: int, embed_dim: int | None = None, target_d: int | None = None
    ) -> list[dict[str, Any]]:
        """layout_of with the built-in widths given one by one (the draft's hidden width, its
        embedding's, the target's), as train.py and the tests call it."""
        return self.layout_of({"hidden": d, "embedding": embed_dim, "target_hidden": target_d})

    def layout_of(self, widths: Mapping[str, int | None]) -> list[dict[str, Any]]:
        """[{name, width}] in vector order: what the exported weight vector multiplies.
        `widths`: each dense width by name (RecordSet.widths, and `embedding`)."""
        layout = []
        for name in self.names:
            kind = FEATURES[name].width
            width = 1 if kind is None else widths.get(kind)
            if not width:
                raise ValueError(f"{name} needs {dense_widths()[str(kind)]}")
            layout.append({"name": name, "width": int(width)})
        return layout


@dataclass
class Features:
    """Verifier inputs of n records: half-precision dense blocks plus float32 scalars."""

    dense: torch.Tensor  # (n, d_dense) float16
    scalars: torch.Tensor  # (n, k) float32

    def __len__(self) -> int:
        return int(self.dense.shape[0])

    @property
    def dim(self) -> int:
        return int(self.dense.shape[1] + self.scalars.shape[1])

    def batch(self, index: torch.Tensor | None = None) -> torch.Tensor:
        """float32 (len(index), dim) rows; the half-to-float cast happens per batch."""
        dense = self.dense if index is None else self.dense.index_select(0, index)
        scalars = self.scalars if index is None else self.scalars.index_select(0, index)
        return torch.cat([dense.float(), scalars], dim=1)

    def column_stats(self, chunk: int = 65536) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-column mean and standard deviation (float64 sums over chunks; std 0 -> 1)."""
        total = torch.zeros(self.dim, dtype=torch.float64)
        square = torch.zeros(self.dim, dtype=torch.float64)
        for start in range(0, len(self), chunk):
            rows = self.batch(torch.arange(start, min(start + chunk, len(self)))).double()
            total += rows.sum(0)
            square += (rows * rows).sum(0)
        n = max(len(self), 1)
        mean = total / n
        std = (square / n - mean * mean).clamp(min=0).sqrt()
        std[std < 1e-6] = 1.0
        return mean.float(), std.float()


def assemble(spec: FeatureSpec, parts: Mapping[str, torch.Tensor]) -> Features:
    """The verifier's input of n rows from its parts, in feature_order(): (n, width) dense blocks
    and (n,) scalars. Training and decoding both build through here, so a decoder sees the
    numbers a verifier was fitted on: dense blocks rounded to float16 (how records store the
    hidden state), scalars in float32."""
    missing = [name for name in spec.names if name not in parts]
    if missing:
        raise ValueError(f"verifier features {missing} were not given (have {sorted(parts)})")
    first = parts[spec.names[0]]
    n, device = int(first.shape[0]), first.device  # the empty block too: cat needs one device
    blocks = [_half(parts[name]) for name in spec.dense]
    dense = (
        torch.cat(blocks, dim=1)
        if blocks
        else torch.zeros((n, 0), dtype=torch.float16, device=device)
    )
    columns = [parts[name].to(torch.float32) for name in spec.scalars]
    scalars = (
        torch.stack(columns, dim=1)
        if columns
        else torch.zeros((n, 0), dtype=torch.float32, device=device)
    )
    return Features(dense, scalars)


def _half(block: torch.Tensor) -> torch.Tensor:
    """float16 as records store it (a record's hidden state already is)."""
    return block if block.dtype == torch.float16 else as_record_half(block)


def build_features(
    spec: FeatureSpec,
    arrays: Mapping[str, np.ndarray] | np.ndarray,
    columns: dict[str, np.ndarray],
    embedder: Embedder | None = None,
) -> Features:
    """Features of n records from their recorded float16 arrays (by feature name: those of
    `spec.arrays`) and record columns, each by its feature's `from_records`. A bare array is
    the draft's hidden states (the one array callers passed before there were others)."""
    if isinstance(arrays, np.ndarray):
        arrays = {"hidden": arrays}
    records = RecordInputs(columns, arrays, embedder)
    settings = dict(spec.settings)
    return assemble(spec, {n: FEATURES[n].from_records(records, settings) for n in spec.names})


class DraftEmbedder:
    """The draft's input embedding of token ids, loaded on first use (picklable for DDP)."""

    def __init__(self, spec: dict[str, Any], cache_dir: str | None = None) -> None:
        self.spec = spec
        self.cache_dir = cache_dir
        self._embedding: torch.nn.Module | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "cache_dir": self.cache_dir, "_embedding": None}

    def _load(self) -> torch.nn.Module:
        if self._embedding is None:
            from sprinter_train.models.loading import load_model

            loaded = load_model(
                self.spec, "draft", torch.device("cpu"), torch.float32, self.cache_dir
            )
            self._embedding = loaded.model.get_input_embeddings()
        return self._embedding

    @property
    def dim(self) -> int:
        with torch.no_grad():
            return int(self._load()(torch.zeros(1, dtype=torch.long)).shape[-1])

    def __call__(self, token_ids: np.ndarray) -> np.ndarray:
        unique, inverse = np.unique(token_ids, return_inverse=True)
        with torch.no_grad():
            vectors = self._load()(torch.from_numpy(unique)).float().numpy()
        return vectors[inverse]
