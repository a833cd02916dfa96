"""A causal LM over a batch of rows, each behind its own part of a shared KV cache.

One forward appends a block of tokens (counts[r] of them for row r, the rest of the block
empty) and returns the logits and hidden states only at the positions the caller asks for:
a full-vocabulary head over every fed position would cost as much as the body.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from sprinter_train.core.runtime import synchronize
from sprinter_train.decoding.cache import RowCache
from sprinter_train.models.forward import body, head_logits


@dataclass
class RowOutput:
    logits: torch.Tensor  # (rows, keep, V) float32 on the shared vocabulary
    hidden: torch.Tensor  # (rows, keep, d) the hidden state verifiers read


class ModelRunner:
    """Feeds blocks of tokens to a `RowCache` and applies the head where logits are used.

    `hidden_layer` -1 is the final normed hidden state (the one the head reads); k >= 0 picks
    `hidden_states[k]`. On CPU the seconds inside forwards are summed for the bench's time
    breakdown; on CUDA they are measured with events, read when the caller asks (no sync).
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int, hidden_layer: int = -1) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.hidden_layer = hidden_layer
        self.device = next(model.parameters()).device
        self._cpu_seconds = 0.0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def new_cache(self, rows: int) -> RowCache:
        return RowCache(rows, self.device)

    @property
    def seconds(self) -> float:
        """Time inside this model's forwards so far (drains the CUDA event list)."""
        if self._events:
            synchronize(self.device)
            self._cpu_seconds += sum(a.elapsed_time(b) for a, b in self._events) / 1000.0
            self._events.clear()
        return self._cpu_seconds

    @torch.inference_mode()
    def forward(
        self, cache: RowCache, ids: torch.Tensor, counts: torch.Tensor, keep: torch.Tensor
    ) -> RowOutput:
        """Append ids[r, :counts[r]] to row r; return the outputs at block offsets keep[r, k]
        (the offset of the token whose next-token distribution is wanted; clamped into the
        block, so a row's unused entries may point anywhere)."""
        width = ids.shape[1]
        positions, mask = cache.block(counts, width)
        cuda = self.device.type == "cuda"
        start = torch.cuda.Event(enable_timing=True) if cuda else None
        if start is not None:
            start.record()
        began = time.perf_counter()
        final, chosen, kv = body(
            self.model,
            ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache.kv,
            hidden_layer=self.hidden_layer,
            use_cache=True,
        )
        cache.append(kv, counts, width)
        index = keep.clamp(0, width - 1)
        picked = final.gather(1, index[..., None].expand(-1, -1, final.shape[-1]))
        hidden = chosen.gather(1, index[..., None].expand(-1, -1, chosen.shape[-1]))
        logits = head_logits(self.model, picked, self.vocab_size).float()
        if start is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((start, end))
        else:
            self._cpu_seconds += time.perf_counter() - began
        return RowOutput(logits, hidden)
