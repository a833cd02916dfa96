"""What the verifier sees: SPRINTER §3.2's s(x, prefix), by default the draft's hidden state.

Extra inputs (for ablations and issue #25), each known when the draft is scored, without a
target call:
- `token_embedding`: the draft's input embedding of the drafted token x;
- `q`: its draft probability q(x); `draft_entropy`: H(q) of the warped q, nats;
- `draft_margin`: the draft's raw logit top-1 minus top-2 at the position (vLLM's online
  acceptance estimator); `draft_entropy_raw`: H(softmax(raw draft logits));
- `run_position`: how many draft-made tokens stand right before the position (at decode:
  the row's run at the round's start plus the draft's index in the round), clipped at the
  sidecar's `run_position_cap`;
- `accept_so_far`: the row's acceptance so far, Beta-smoothed (`smoothed_acceptance`);
- `target_hidden` / `target_margin`: the target's final hidden state and raw top-2 logit
  margin at the row's last target-verified position: for a draft at t with run position r,
  the target's state at t - r - 2 (decoding/state.py's RowState says why; zero where the
  target has verified nothing of the row yet).

The feature vector's layout is fixed by FEATURE_ORDER (dense blocks first) whatever order the
config lists them in, so a checkpoint's sidecar (names, layout and `settings`) fully
describes the vector a decoder must build. `assemble` puts the parts together for training
(from records) and for decoding (verifier/scorer.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sprinter_train.core.half import as_record_half

DENSE = ("hidden", "token_embedding", "target_hidden")  # float16 blocks, kept half in memory
FEATURE_ORDER = (
    *DENSE,
    "q",
    "draft_entropy",
    "draft_margin",
    "draft_entropy_raw",
    "run_position",
    "accept_so_far",
    "target_margin",
)
# scalar features read straight from one record column
SCALAR_COLUMNS = {
    "q": "q",
    "draft_entropy": "draft_entropy",
    "draft_margin": "draft_margin",
    "draft_entropy_raw": "draft_entropy_raw",
    "target_margin": "target_margin",
}
# scalar features computed from record columns, and the settings each needs
DERIVED_COLUMNS = {
    "run_position": ("run_position",),
    "accept_so_far": ("accepted_before", "drafts_before"),
}
SETTINGS = {
    "run_position": ("run_position_cap",),
    "accept_so_far": ("accept_prior", "accept_n0"),
}

Embedder = Callable[[np.ndarray], np.ndarray]  # token ids -> (n, e) float embeddings
Array = torch.Tensor


def smoothed_acceptance(accepted: Array, drafts: Array, prior: float, n0: float) -> Array:
    """(accepted + n0 * prior) / (drafts + n0): a row's acceptance so far, pulled toward
    `prior` while it has few drafts (a Beta(n0 * prior, n0 * (1 - prior)) prior's mean).

    Decoding and training estimate the same quantity, the row's mean acceptance of its
    earlier drafts, from different counts: the decoder counts the drafts it proposed in
    earlier rounds and those kept as drawn (accepted by the target's check or trusted by a
    verifier), so drafts of the current round are not in it yet; records count every earlier
    recorded position of the sequence (each one a draft x ~ q) with its expected acceptance
    min(1, p/q) in place of a 0/1 outcome."""
    return (accepted.float() + n0 * prior) / (drafts.float() + n0)


def clipped_run(run: Array, cap: int) -> Array:
    """The run position as the verifier sees it, float32 in [0, cap]: records and decoding
    clip at the same sidecar value, so neither meets a range the other never had."""
    return run.clamp(min=0, max=cap).float()


@dataclass(frozen=True)
class FeatureSpec:
    """Which inputs the verifier takes, in FEATURE_ORDER, and the settings some of them
    need (`SETTINGS`: the run position's cap, the acceptance's prior and weight)."""

    names: tuple[str, ...] = ("hidden",)
    settings: tuple[tuple[str, float], ...] = ()

    @classmethod
    def from_names(
        cls, names: Sequence[str], settings: Mapping[str, Any] | None = None
    ) -> FeatureSpec:
        unknown = sorted(set(names) - set(FEATURE_ORDER))
        if unknown or not names:
            raise ValueError(
                f"train.features must list some of {', '.join(FEATURE_ORDER)}; got {list(names)}"
            )
        ordered = tuple(n for n in FEATURE_ORDER if n in set(names))
        needed = sorted({key for n in ordered for key in SETTINGS.get(n, ())})
        given = dict(settings or {})
        missing = [key for key in needed if given.get(key) is None]
        if missing:
            raise ValueError(
                f"verifier features {[n for n in ordered if n in SETTINGS]} need the settings "
                f"{missing} (train.feature_settings)"
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
        return tuple(n for n in self.names if n in DENSE)

    @property
    def scalars(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n not in DENSE)

    def record_columns(self) -> list[str]:
        """Record columns the features need besides the hidden states."""
        cols = [SCALAR_COLUMNS[n] for n in self.scalars if n in SCALAR_COLUMNS]
        cols += [c for n in self.scalars for c in DERIVED_COLUMNS.get(n, ())]
        return cols + (["token_id"] if "token_embedding" in self.names else [])

    def describe(self) -> dict[str, Any]:
        """The sidecar's `settings` (an empty dict when no feature needs one)."""
        return dict(self.settings)

    def layout(
        self, d: int, embed_dim: int | None = None, target_d: int | None = None
    ) -> list[dict[str, Any]]:
        """[{name, width}] in vector order: what the exported weight vector multiplies."""
        widths = {"hidden": d, "token_embedding": embed_dim, "target_hidden": target_d}
        if "target_hidden" in self.names and not target_d:
            raise ValueError("target_hidden needs the target's hidden width")
        if "token_embedding" in self.names and not embed_dim:
            raise ValueError("token_embedding needs the draft's embedding width")
        return [{"name": n, "width": int(widths.get(n) or 1)} for n in self.names]


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
    target_hidden: np.ndarray | None = None,
) -> Features:
    """Features of n records from their float16 hidden states (the draft's; the target's
    where `target_hidden` is named) and record columns."""
    parts: dict[str, torch.Tensor] = {}
    if "hidden" in spec.names:
        parts["hidden"] = torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float16))
    if "target_hidden" in spec.names:
        if target_hidden is None:
            raise ValueError("the target_hidden feature needs the records' target hidden states")
        parts["target_hidden"] = torch.from_numpy(
            np.ascontiguousarray(target_hidden, dtype=np.float16)
        )
    if "token_embedding" in spec.names:
        if embedder is None:
            raise ValueError("the token_embedding feature needs the draft model's embedding")
        emb = embedder(np.asarray(columns["token_id"], dtype=np.int64))
        parts["token_embedding"] = torch.from_numpy(np.ascontiguousarray(emb, dtype=np.float32))
    for name in spec.scalars:
        if name in SCALAR_COLUMNS:
            parts[name] = _column(columns, SCALAR_COLUMNS[name])
    if "run_position" in spec.names:
        cap = int(spec.setting("run_position_cap"))
        parts["run_position"] = clipped_run(_column(columns, "run_position"), cap)
    if "accept_so_far" in spec.names:
        parts["accept_so_far"] = smoothed_acceptance(
            _column(columns, "accepted_before"),
            _column(columns, "drafts_before"),
            spec.setting("accept_prior"),
            spec.setting("accept_n0"),
        )
    return assemble(spec, parts)


def _column(columns: Mapping[str, np.ndarray], name: str) -> torch.Tensor:
    return torch.from_numpy(np.asarray(columns[name], dtype=np.float32))


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
