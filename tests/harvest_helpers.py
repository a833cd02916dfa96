"""Tiny models the harvest tests generate continuations with, and their tiny harvest config."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from sprinter_train.core.config import compose_config
from sprinter_train.harvest.continuations import ContinuationRunners
from sprinter_train.models.loading import LoadedModel
from sprinter_train.models.roles import Roles
from sprinter_train.models.tiny import build_tiny_model, build_tiny_tokenizer
from tests.decoding_helpers import PACK_EVERY


def tiny_gpt2() -> torch.nn.Module:
    """Absolute position embeddings: wrong position ids on padded rows change its output."""
    torch.manual_seed(5)
    config = GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    return GPT2LMHeadModel(config).eval()


def default_runners(models: Roles) -> ContinuationRunners:
    """New continuation runners of `models` in the runners' default layout, packing every
    conf/config.yaml's `decoding.pack_every` rounds (the harvest's own take its layout)."""
    return ContinuationRunners(models, pack_every=PACK_EVERY)


def generating_models(family: str, eos_token_id: int | None) -> Roles:
    """A tiny draft and a target of `family` that disagree often (interleaved rows reject)."""
    if family == "llama":
        target = build_tiny_model({"num_hidden_layers": 2, "initializer_range": 0.2}, seed=5)
    else:
        target = tiny_gpt2()
    draft = build_tiny_model({"num_hidden_layers": 1, "initializer_range": 0.2}, seed=6)
    tokenizer = build_tiny_tokenizer()
    return Roles(
        LoadedModel("draft", draft, tokenizer),
        LoadedModel("target", target, tokenizer),
        None,
        128,
        eos_token_id,
    )


# 8 prompts, 6 records each, 3 prompts per shard (shards of 3, 3, 2), 2 sequences per forward
TINY = (
    "stage=harvest",
    "models=tiny_random",
    "device=cpu",
    "dtype=float32",  # tests compare against float32 recomputations
    "data.num_prompts=8",
    "data.max_prompt_tokens=48",
    "harvest.continuation_tokens=6",
    "harvest.shard_rows=18",
    "harvest.batch_size=2",
)


def compose_at(root: Path, *overrides: str):
    return compose_config(f"artifacts_root={root}", *TINY, *overrides)
