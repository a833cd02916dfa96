"""What the verifier sees: SPRINTER §3.2's s(x, prefix), by default the draft's hidden state.

Extra inputs (for ablations) are `token_embedding` (the draft's input embedding of the
drafted token x), `q` (its draft probability q(x)) and `draft_entropy` (H(q), nats). The
feature vector's layout is fixed by FEATURE_ORDER whatever order the config lists them in,
so a checkpoint's sidecar fully describes the vector a decoder must build. `assemble` puts
the parts together for training (from records) and for decoding (verifier/scorer.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sprinter_train.core.half import as_record_half

FEATURE_ORDER = ("hidden", "token_embedding", "q", "draft_entropy")
DENSE = ("hidden", "token_embedding")  # float16 blocks, kept half precision in memory
SCALAR_COLUMNS = {"q": "q", "draft_entropy": "draft_entropy"}

Embedder = Callable[[np.ndarray], np.ndarray]  # token ids -> (n, e) float embeddings


@dataclass(frozen=True)
class FeatureSpec:
    """Which inputs the verifier takes, in FEATURE_ORDER."""

    names: tuple[str, ...] = ("hidden",)

    @classmethod
    def from_names(cls, names: Sequence[str]) -> FeatureSpec:
        unknown = sorted(set(names) - set(FEATURE_ORDER))
        if unknown or not names:
            raise ValueError(
                f"train.features must list some of {', '.join(FEATURE_ORDER)}; got {list(names)}"
            )
        return cls(tuple(n for n in FEATURE_ORDER if n in set(names)))

    @property
    def dense(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n in DENSE)

    @property
    def scalars(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n not in DENSE)

    def record_columns(self) -> list[str]:
        """Record columns the features need besides the hidden states."""
        cols = [SCALAR_COLUMNS[n] for n in self.scalars]
        return cols + (["token_id"] if "token_embedding" in self.names else [])

    def layout(self, d: int, embed_dim: int | None = None) -> list[dict[str, Any]]:
        """[{name, width}] in vector order: what the exported weight vector multiplies."""
        widths = {"hidden": d, "token_embedding": embed_dim, "q": 1, "draft_entropy": 1}
        if "token_embedding" in self.names and not embed_dim:
            raise ValueError("token_embedding needs the draft's embedding width")
        return [{"name": n, "width": int(widths[n])} for n in self.names]


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
    """The verifier's input of n rows from its parts, in FEATURE_ORDER: (n, width) dense blocks
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
    hidden: np.ndarray,
    columns: dict[str, np.ndarray],
    embedder: Embedder | None = None,
) -> Features:
    """Features of n records from their float16 hidden states and record columns."""
    parts: dict[str, torch.Tensor] = {}
    if "hidden" in spec.names:
        parts["hidden"] = torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float16))
    if "token_embedding" in spec.names:
        if embedder is None:
            raise ValueError("the token_embedding feature needs the draft model's embedding")
        emb = embedder(np.asarray(columns["token_id"], dtype=np.int64))
        parts["token_embedding"] = torch.from_numpy(np.ascontiguousarray(emb, dtype=np.float32))
    for name in spec.scalars:
        parts[name] = torch.from_numpy(np.asarray(columns[SCALAR_COLUMNS[name]], dtype=np.float32))
    return assemble(spec, parts)


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
