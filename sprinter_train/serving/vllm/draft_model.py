"""The distilled draft (models/student.py) as a vLLM model.

vLLM's Llama holds a V x d embedding and a V x d head; the draft has a factorised embedding
(V x r then r x d) and a head over K token ids, its logits -inf elsewhere (q = 0 there, which
speculative sampling handles exactly: such tokens are never proposed). This class is vLLM's
Llama with those two swapped, the same parameter names as the Hugging Face checkpoint, so
vLLM's loader reads the saved folder as it is. `compute_logits` also keeps the head's own
logits of the last call (`head_logits`), which the predictor reads (proposer.py): vLLM
divides the logits it samples from by the temperature in place.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.llama import LlamaForCausalLM

from sprinter_train.models.student import FactorizedEmbedding  # E = low @ up, same names

ARCHITECTURE = "SprinterDraftForCausalLM"


class RestrictedHead(nn.Module):
    """Logits over K token ids (`weight` K x d, `token_ids` K), as models/student's."""

    def __init__(self, hidden_size: int, head_vocab_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(head_vocab_size, hidden_size), requires_grad=False)
        self.token_ids = nn.Parameter(
            torch.arange(head_vocab_size, dtype=torch.long), requires_grad=False
        )


class SprinterDraftForCausalLM(LlamaForCausalLM):
    """vLLM's Llama with the draft's factorised embedding and restricted head."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", **kwargs) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        config = vllm_config.model_config.hf_config
        dtype = vllm_config.model_config.dtype
        self.vocab_size = int(config.vocab_size)
        if getattr(config, "embed_rank", None):
            self.model.embed_tokens = FactorizedEmbedding(
                config.vocab_size, config.embed_rank, config.hidden_size
            ).to(dtype)
        if getattr(config, "head_vocab_size", None):
            self.lm_head = RestrictedHead(config.hidden_size, config.head_vocab_size).to(dtype)
            self.lm_head.token_ids.data = self.lm_head.token_ids.data.long()
        self.head_logits: torch.Tensor | None = None

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not isinstance(self.lm_head, RestrictedHead):
            logits = super().compute_logits(hidden_states)
            self.head_logits = logits
            return logits
        small = hidden_states @ self.lm_head.weight.t()
        self.head_logits = small
        full = small.new_full((*small.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.lm_head.token_ids] = small
        return full

    def head_token_ids(self) -> torch.Tensor | None:
        """The head's token ids (None: the whole vocabulary)."""
        head = self.lm_head
        return head.token_ids if isinstance(head, RestrictedHead) else None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The swapped modules' weights by name, the rest by vLLM's Llama loader."""
        own = dict(self.named_parameters())
        swapped = ("model.embed_tokens.", "lm_head.")
        loaded: set[str] = set()

        def rest() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if name.startswith(swapped) and name in own:
                    param = own[name]
                    if name == "lm_head.token_ids":
                        param.data = tensor.to(param.device, torch.long)
                    else:
                        default_weight_loader(param, tensor)
                    loaded.add(name)
                else:
                    yield name, tensor

        loaded |= super().load_weights(rest())
        return loaded
