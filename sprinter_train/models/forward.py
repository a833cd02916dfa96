"""The three models of a harvest, loaded together, with the vocabulary they share (the
forward passes harvest and decoding run on them are models/body.py's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

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
