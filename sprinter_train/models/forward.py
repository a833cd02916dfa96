"""The three models of a harvest and the forward passes it needs from them.

Logits are computed only where they are used (the head applied to selected hidden states):
a full-vocabulary head over every prompt position would cost as much as the model body
for a 49k-token vocabulary and hold gigabytes for long batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from sprinter_train.models.cache import returned_cache, with_cache
from sprinter_train.models.loading import LoadedModel, check_tokenizers_agree, load_model


@dataclass
class HarvestModels:
    """Draft, target and optional SV companion, with the vocabulary they share."""

    draft: LoadedModel
    target: LoadedModel
    companion: LoadedModel | None
    vocab_size: int
    eos_token_id: int | None

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.target.tokenizer

    def all(self) -> list[LoadedModel]:
        return [m for m in (self.target, self.draft, self.companion) if m is not None]


def load_harvest_models(
    models_cfg: DictConfig, device: torch.device, dtype: torch.dtype
) -> HarvestModels:
    """Load the models and stop before any work if their tokenizers disagree. Nothing here
    trains them: with `pack_linear` their linears are prepacked (`models.packed`)."""
    specs: dict[str, Any] = OmegaConf.to_container(models_cfg, resolve=True)  # type: ignore[assignment]
    cache, packed = specs.get("cache_dir"), bool(specs.get("pack_linear", False))
    target = load_model(specs["target"], "target", device, dtype, cache, packed)
    draft = load_model(specs["draft"], "draft", device, dtype, cache, packed)
    companion = None
    if specs.get("companion"):
        companion = load_model(specs["companion"], "companion", device, dtype, cache, packed)
    loaded = [m for m in (target, draft, companion) if m is not None]
    check_tokenizers_agree(loaded)
    # vocabularies may be padded differently (e.g. Qwen 0.5B vs 7B); ids past the shared
    # range are unused padding, so every distribution lives on the shared range
    vocab = min(int(m.model.config.vocab_size) for m in loaded)
    return HarvestModels(draft, target, companion, vocab, target.tokenizer.eos_token_id)


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
