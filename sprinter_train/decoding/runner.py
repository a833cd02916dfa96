"""A causal LM behind a KV cache that is kept, cropped and extended, never recomputed.

A `CacheSlot` holds one sequence's cache for one model and the tokens fed into it; the slot
lives in the sequence's state, not in the model wrapper, so several sequences (a later
batching issue) can share one `ModelRunner`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from sprinter_train.core.runtime import synchronize
from sprinter_train.models.cache import crop_cache
from sprinter_train.models.forward import body, head_logits


@dataclass
class CacheSlot:
    """One model's KV cache for one sequence, and the tokens whose keys and values it holds."""

    cache: Any = None  # made by the runner on first use
    fed: list[int] = field(default_factory=list)

    def keep_common_prefix(self, tokens: list[int], limit: int | None = None) -> None:
        """Crop to the longest prefix shared with `tokens` (at most `limit` positions)."""
        n = 0
        bound = min(len(self.fed), len(tokens), limit if limit is not None else len(tokens))
        while n < bound and self.fed[n] == tokens[n]:
            n += 1
        if n < len(self.fed):
            crop_cache(self.cache, n)
            del self.fed[n:]


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # (keep, V) float32 on the shared vocabulary
    hidden: torch.Tensor  # (keep, d) the hidden state verifiers read


class ModelRunner:
    """Feeds only the tokens a cache lacks and computes the head only where logits are used.

    `hidden_layer` -1 is the final normed hidden state (the one the head reads); k >= 0 picks
    `hidden_states[k]`. Seconds inside forwards are summed for the bench's time breakdown
    (on CPU only: on an accelerator timing each call would need a sync).
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int, hidden_layer: int = -1) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.hidden_layer = hidden_layer
        self.device = next(model.parameters()).device
        self.seconds = 0.0
        self.timed = self.device.type == "cpu"

    def new_cache(self) -> Any:
        return DynamicCache()

    @contextmanager
    def _clock(self) -> Iterator[None]:
        start = time.perf_counter()
        yield
        if self.timed:
            synchronize(self.device)
            self.seconds += time.perf_counter() - start

    @torch.inference_mode()
    def extend(self, slot: CacheSlot, tokens: list[int], keep: int = 1) -> ForwardOutput:
        """Make the slot hold `tokens` (cropping what diverges) and return the last `keep`
        positions' logits; at least `keep` tokens are fed, so those logits are fresh."""
        if slot.cache is None:
            slot.cache = self.new_cache()
        slot.keep_common_prefix(tokens, limit=len(tokens) - keep)
        new = tokens[len(slot.fed) :]
        with self._clock():
            ids = torch.tensor([new], device=self.device)
            final, chosen, slot.cache = body(
                self.model,
                ids,
                past_key_values=slot.cache,
                hidden_layer=self.hidden_layer,
                use_cache=True,
            )
            logits = head_logits(self.model, final[0, -keep:], self.vocab_size).float()
        slot.fed.extend(new)
        return ForwardOutput(logits, chosen[0, -keep:])

    @torch.inference_mode()
    def step_rows(self, cache: Any, tokens: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """One token per row of a batched cache (MTAD's beams): ((rows, V) logits, cache)."""
        with self._clock():
            ids = tokens.reshape(-1, 1).to(self.device)
            final, _, cache = body(self.model, ids, past_key_values=cache, use_cache=True)
            logits = head_logits(self.model, final[:, -1], self.vocab_size).float()
        return logits, cache
