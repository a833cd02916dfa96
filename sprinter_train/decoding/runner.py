"""A causal LM behind a KV cache that is kept, cropped and extended, never recomputed.

A `CacheSlot` holds one sequence's cache for one model and the tokens fed into it; the slot
lives in the sequence's state, not in the model wrapper, so several sequences (a later
batching issue) can share one `ModelRunner`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from sprinter_train.models.cache import crop_cache
from sprinter_train.runtime import synchronize


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
    `hidden_states[k]`. Calls and seconds are counted for the bench's time breakdown.
    """

    def __init__(
        self, model: torch.nn.Module, vocab_size: int, hidden_layer: int = -1, name: str = ""
    ) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.hidden_layer = hidden_layer
        self.name = name
        self.device = next(model.parameters()).device
        self.calls = 0
        self.seconds = 0.0
        self.timed = self.device.type == "cpu"  # on accelerators timing needs a sync

    def new_cache(self) -> Any:
        return DynamicCache()

    @torch.inference_mode()
    def extend(self, slot: CacheSlot, tokens: list[int], keep: int = 1) -> ForwardOutput:
        """Make the slot hold `tokens` (cropping what diverges) and return the last `keep`
        positions' logits; at least `keep` tokens are fed, so those logits are fresh."""
        if slot.cache is None:
            slot.cache = self.new_cache()
        slot.keep_common_prefix(tokens, limit=len(tokens) - keep)
        new = tokens[len(slot.fed) :]
        start = time.perf_counter()
        ids = torch.tensor([new], device=self.device)
        out = self.model.base_model(
            input_ids=ids,
            past_key_values=slot.cache,
            use_cache=True,
            output_hidden_states=self.hidden_layer != -1,
        )
        slot.cache = out.past_key_values
        slot.fed.extend(new)
        final = out.last_hidden_state[0, -keep:]
        chosen = (
            final if self.hidden_layer == -1 else out.hidden_states[self.hidden_layer][0, -keep:]
        )
        logits = self.model.get_output_embeddings()(final)[..., : self.vocab_size].float()
        if self.timed:
            synchronize(self.device)
            self.seconds += time.perf_counter() - start
        self.calls += 1
        return ForwardOutput(logits, chosen)

    @torch.inference_mode()
    def step_rows(self, cache: Any, tokens: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """One token per row of a batched cache (MTAD's beams): ((rows, V) logits, cache)."""
        start = time.perf_counter()
        out = self.model.base_model(
            input_ids=tokens.reshape(-1, 1).to(self.device), past_key_values=cache, use_cache=True
        )
        final = out.last_hidden_state[:, -1]
        logits = self.model.get_output_embeddings()(final)[..., : self.vocab_size].float()
        if self.timed:
            synchronize(self.device)
            self.seconds += time.perf_counter() - start
        self.calls += 1
        return logits, out.past_key_values

    def enable_timing(self) -> None:
        """Time calls on an accelerator too (each call then waits for the device)."""
        self.timed = True

    def reset_counters(self) -> None:
        self.calls, self.seconds = 0, 0.0
