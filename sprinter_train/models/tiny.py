"""Tiny random models and a character tokenizer, built in code: tests need no download."""

from __future__ import annotations

import string
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from sprinter_train.models.student import SprinterDraftConfig, SprinterDraftForCausalLM

SPECIALS = ["<unk>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TINY_DEFAULTS: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "tie_word_embeddings": False,
}


def build_tiny_tokenizer(shift: int = 0) -> PreTrainedTokenizerFast:
    """One token per printable character. `shift` rotates the character ids: a different mapping."""
    chars = sorted(set(string.printable) - set("\x0b\x0c"))
    chars = chars[shift % len(chars) :] + chars[: shift % len(chars)]
    vocab = {token: index for index, token in enumerate(SPECIALS + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)[\\s\\S]"), behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_config(overrides: dict[str, Any]) -> LlamaConfig:
    """The config of TINY_DEFAULTS + overrides (a restricted-head draft's where they ask for
    one), alone: what a settings check reads without building the model."""
    settings = {**TINY_DEFAULTS, **overrides}
    if settings.get("embed_rank") or settings.get("head_vocab_size"):
        return SprinterDraftConfig(**settings)
    return LlamaConfig(**settings)


def build_tiny_model(overrides: dict[str, Any], seed: int = 0) -> LlamaForCausalLM:
    """A randomly initialised Llama (or restricted-head draft) from TINY_DEFAULTS + overrides."""
    config = tiny_config(overrides)
    torch.manual_seed(seed)
    if isinstance(config, SprinterDraftConfig):
        return SprinterDraftForCausalLM(config).eval()
    return LlamaForCausalLM(config).eval()
