"""The forward passes harvest and decoding share: the model body, then the head where logits
are used.

Logits are computed only where they are used (the head applied to selected hidden states):
a full-vocabulary head over every prompt position would cost as much as the model body
for a 49k-token vocabulary and hold gigabytes for long batches.
"""

from __future__ import annotations

from typing import Any

import torch

from sprinter_train.models.cache import cache_kwarg, returned_cache


def body(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    past_key_values: Any = None,
    hidden_layer: int = -1,
    use_cache: bool = False,
    cache_name: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """(final hidden states, hidden states of `hidden_layer`, cache) of the model body.

    Layer -1 is the final (normed) hidden state, the one the head reads; k >= 0 indexes
    `hidden_states` as transformers returns them (0 = embeddings). `cache_name`: the forward
    argument the cache goes under (`models.cache.cache_kwarg` of the base model), resolved
    by a caller that compiles this function: traced, the lookup reads the process-wide
    memo of every model type seen, and dynamo's guard on that memo fails, recompiling every
    graph, as soon as any other model type is looked up.
    """
    base = model.base_model
    out = base(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=use_cache,
        output_hidden_states=hidden_layer != -1,
        **{cache_name or cache_kwarg(base): past_key_values},
    )
    final = out.last_hidden_state
    chosen = final if hidden_layer == -1 else out.hidden_states[hidden_layer]
    return final, chosen, returned_cache(out)


class StaticBody(torch.nn.Module):
    """`body` over one block of a static layout (ids, positions, mask, the `SlotMappedKV`),
    as a module of its own: what a compiled static step compiles. Its forward reads nothing
    but the model and two settings, so a graph saved with its guards
    (`core.precompiled`) carries no other object of the process that compiled it."""

    def __init__(self, model: torch.nn.Module, hidden_layer: int) -> None:
        super().__init__()
        self.model = model
        self.hidden_layer = hidden_layer
        # resolved here, not in the traced forward: see `body`'s `cache_name`
        self.cache_name = cache_kwarg(model.base_model)

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, kv: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(final hidden states, `hidden_layer`'s) of the block; the cache filled in place."""
        final, chosen, _ = body(
            self.model,
            ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=kv,
            hidden_layer=self.hidden_layer,
            use_cache=True,
            cache_name=self.cache_name,
        )
        return final, chosen


def head_logits(model: torch.nn.Module, hidden: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits on the shared vocabulary for the given final hidden states."""
    return model.get_output_embeddings()(hidden)[..., :vocab_size]
