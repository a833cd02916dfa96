"""Which model families the engine runs, and each model's KV layout read from the model.

A config is not a reliable description of the keys and values a model writes: Qwen2's and
Phi-3's hub configs carry no `head_dim` (the attention derives it from `num_attention_heads`),
GPT-2's none of the usual names, Gemma's a `head_dim` that is not `hidden_size / heads`.
transformers' own `StaticCache` sizes a layer from the first keys it is handed; `kv_layout`
does the same once per model, with a one-token forward into a `DynamicCache`, so a static
buffer has the shape the model writes by construction. The same probe is the load-time check
that the engine can run a model at all: a family whose forward cannot fill a per-layer cache
of (rows, heads, slots, head dim) keys is refused when it loads, naming the family, instead of
failing mid-decode with a shape error.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from sprinter_train.models.body import body

# the families tests/decoding/test_families.py decodes in every layout (and the distilled draft's)
TESTED_FAMILIES = (
    "llama",
    "qwen2",
    "qwen3",
    "mistral",
    "gemma",
    "gemma2",
    "phi3",
    "gpt2",
    "gpt_neox",
    "sprinter_draft",
)


class UnsupportedModelError(ValueError):
    """The engine cannot run this model; the message names its family and why."""


@dataclass(frozen=True)
class KVLayout:
    """Per layer: the key/value heads and the head dimension the model writes to its cache."""

    heads: list[int]
    head_dims: list[int]


_LAYOUTS: weakref.WeakKeyDictionary[torch.nn.Module, KVLayout] = weakref.WeakKeyDictionary()


def family(model: torch.nn.Module) -> str:
    """The model's family as transformers names it (`config.model_type`)."""
    config = getattr(model, "config", None)
    return str(getattr(config, "model_type", None) or type(model).__name__)


def kv_layout(model: torch.nn.Module) -> KVLayout:
    """The keys' and values' shapes `model` writes, from a one-token forward (once a model)."""
    layout = _LAYOUTS.get(model)
    if layout is not None:
        return layout
    device = next(model.parameters()).device
    ids = torch.zeros((1, 1), dtype=torch.long, device=device)
    name = family(model)
    try:
        with torch.inference_mode():
            _, _, kv = body(model, ids, past_key_values=DynamicCache(), use_cache=True)
        layers = [(layer.keys, layer.values) for layer in kv.layers]
    except Exception as error:  # any failure of the probe means the engine cannot run it
        raise UnsupportedModelError(
            f"{name} models cannot run on the decoding engine: a one-token forward into a "
            f"transformers DynamicCache failed ({type(error).__name__}: {error}). Tested "
            f"families: {', '.join(TESTED_FAMILIES)}."
        ) from error
    if not layers or any(
        k is None or k.dim() != 4 or v.shape[:3] != k.shape[:3] for k, v in layers
    ):
        raise UnsupportedModelError(
            f"{name} models cannot run on the decoding engine: their cache does not hold "
            "per-layer keys and values of shape (rows, heads, slots, head dim). Tested "
            f"families: {', '.join(TESTED_FAMILIES)}."
        )
    layout = KVLayout([int(k.shape[1]) for k, _ in layers], [int(k.shape[3]) for k, _ in layers])
    _LAYOUTS[model] = layout
    return layout
