"""The models of a run by role (target, draft, SV companion): the one loader every stage uses.

A models spec (`cfg.models`, one of conf/models/*.yaml) names each role's model (see
`models.loading`) beside settings that apply to all of them: `cache_dir` (dequantised GGUF
copies), `pack_linear` (prepacked linears for inference-only loads, `models.packed`) and
`lean_draft` (whether a distilled draft decodes through `models.lean.LeanDraft`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from sprinter_train.models.lean import allow_lean
from sprinter_train.models.loading import (
    LoadedModel,
    ModelLoadError,
    check_tokenizers_agree,
    load_model,
)

ROLES = ("target", "draft", "companion")
CPU = torch.device("cpu")


@dataclass
class Roles:
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


def model_specs(models_cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """The models spec as a plain dict, interpolations resolved."""
    if isinstance(models_cfg, DictConfig):
        return OmegaConf.to_container(models_cfg, resolve=True)  # type: ignore[return-value]
    return dict(models_cfg)


def load_role(
    models_cfg: DictConfig | Mapping[str, Any],
    role: str,
    device: torch.device = CPU,
    dtype: torch.dtype = torch.float32,
    pack_linear: bool | None = None,
) -> LoadedModel:
    """One role's model and tokenizer, alone (no agreement check: see `load_roles`).
    `pack_linear` None follows the spec's own; a load that trains or saves the model passes
    False. The spec's `lean_draft` is recorded on the model for the decoding runners."""
    specs = model_specs(models_cfg)
    if not specs.get(role):
        raise ModelLoadError(f"models.{role} is not set")
    packed = bool(specs.get("pack_linear", False)) if pack_linear is None else pack_linear
    loaded = load_model(specs[role], role, device, dtype, specs.get("cache_dir"), packed)
    allow_lean(loaded.model, bool(specs.get("lean_draft", True)))
    return loaded


def load_roles(
    models_cfg: DictConfig | Mapping[str, Any],
    device: torch.device,
    dtype: torch.dtype,
    companion: bool = True,
) -> Roles:
    """Target, draft and (when the spec names one and `companion`) the companion; stop before
    any work if their tokenizers disagree. Nothing here trains them."""
    specs = model_specs(models_cfg)
    target = load_role(specs, "target", device, dtype)
    draft = load_role(specs, "draft", device, dtype)
    with_companion = companion and bool(specs.get("companion"))
    third = load_role(specs, "companion", device, dtype) if with_companion else None
    loaded = [m for m in (target, draft, third) if m is not None]
    check_tokenizers_agree(loaded)
    # vocabularies may be padded differently (e.g. Qwen 0.5B vs 7B); ids past the shared
    # range are unused padding, so every distribution lives on the shared range
    vocab = min(int(m.model.config.vocab_size) for m in loaded)
    return Roles(draft, target, third, vocab, target.tokenizer.eos_token_id)
