"""The distilled draft: a Llama with a factorised embedding and a restricted-vocabulary head.

Per-step latency of a small model on CPU is dominated by per-layer overhead and by the
49k-row head, so the student is wide and shallow (initialised from target layers) and
predicts only the K most frequent tokens. Tokens outside the set get q = 0, which
speculative decoding handles exactly (they are simply never proposed).

This file depends only on torch and transformers: it is copied next to the saved weights
so `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` works without this
package; importing `sprinter_train.models.student` registers it so no flag is needed.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM


class SprinterDraftConfig(LlamaConfig):
    """Llama config plus `embed_rank` (None: full embedding) and `head_vocab_size` (None: full head)."""

    model_type = "sprinter_draft"

    def __init__(self, embed_rank: int | None = None, head_vocab_size: int | None = None, **kwargs):
        self.embed_rank = embed_rank
        self.head_vocab_size = head_vocab_size
        kwargs["tie_word_embeddings"] = False
        super().__init__(**kwargs)


class FactorizedEmbedding(nn.Module):
    """Embedding E = low @ up: V x r then r x d, to keep a 49k-token student small on disk."""

    def __init__(self, vocab_size: int, rank: int, hidden_size: int):
        super().__init__()
        self.low = nn.Embedding(vocab_size, rank)
        self.up = nn.Linear(rank, hidden_size, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.up(self.low(input_ids))


class RestrictedHead(nn.Module):
    """Logits for K token ids, scattered into the full vocabulary with -inf elsewhere (q = 0)."""

    def __init__(self, hidden_size: int, head_vocab_size: int, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.empty(head_vocab_size, hidden_size))
        nn.init.normal_(self.weight, std=0.02)
        self.register_buffer("token_ids", torch.arange(head_vocab_size), persistent=True)

    def restricted(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the K head tokens only (training uses this: no scatter)."""
        return hidden @ self.weight.t()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        small = self.restricted(hidden)
        full = small.new_full((*small.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.token_ids] = small
        return full


class SprinterDraftForCausalLM(LlamaForCausalLM):
    """LlamaForCausalLM whose embedding and head are swapped for the small variants above."""

    config_class = SprinterDraftConfig
    _tied_weights_keys = {}

    def __init__(self, config: SprinterDraftConfig):
        super().__init__(config)
        if config.embed_rank:
            self.model.embed_tokens = FactorizedEmbedding(
                config.vocab_size, config.embed_rank, config.hidden_size
            )
        if config.head_vocab_size:
            self.lm_head = RestrictedHead(
                config.hidden_size, config.head_vocab_size, config.vocab_size
            )
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, RestrictedHead):
            return  # initialised in its constructor, overwritten when loading
        super()._init_weights(module)

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the head's own token set (all V tokens for a full head)."""
        if isinstance(self.lm_head, RestrictedHead):
            return self.lm_head.restricted(hidden)
        return self.lm_head(hidden)

    def head_token_ids(self) -> torch.Tensor:
        if isinstance(self.lm_head, RestrictedHead):
            return self.lm_head.token_ids
        return torch.arange(self.config.vocab_size, device=self.lm_head.weight.device)


AutoConfig.register("sprinter_draft", SprinterDraftConfig, exist_ok=True)
AutoModelForCausalLM.register(SprinterDraftConfig, SprinterDraftForCausalLM, exist_ok=True)
