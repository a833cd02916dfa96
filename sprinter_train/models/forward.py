"""The forward passes harvest and decoding need from a loaded model.

Logits are computed only where they are used (the head applied to selected hidden states):
a full-vocabulary head over every prompt position would cost as much as the model body
for a 49k-token vocabulary and hold gigabytes for long batches.
"""

from __future__ import annotations

from typing import Any

import torch

from sprinter_train.models.cache import returned_cache, with_cache


def body(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    past_key_values: Any = None,
    hidden_layer: int = -1,
    use_cache: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """(final hidden states, hidden states of `hidden_layer`, cache) of the model body.

    Layer -1 is the final (normed) hidden state, the one the head reads; k >= 0 indexes
    `hidden_states` as transformers returns them (0 = embeddings).
    """
    out = model.base_model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=use_cache,
        output_hidden_states=hidden_layer != -1,
        **with_cache(model.base_model, past_key_values),
    )
    final = out.last_hidden_state
    chosen = final if hidden_layer == -1 else out.hidden_states[hidden_layer]
    return final, chosen, returned_cache(out)


def head_logits(model: torch.nn.Module, hidden: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits on the shared vocabulary for the given final hidden states."""
    return model.get_output_embeddings()(hidden)[..., :vocab_size]
