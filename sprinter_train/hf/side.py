"""One model of a speculative pair at batch 1: its KV cache and the outputs the methods read.

Fed as the engine feeds its models (sprinter_train/decoding/engine.py), so the exported
methods see the numbers the bench sees: what the cache lacks of the committed tokens, then
this round's drafts, in one forward; a prompt's prefill leaves its last token to that forward.
The head is applied only where a distribution is wanted, on the vocabulary the models share.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass
class Outputs:
    logits: torch.Tensor  # (k, V) float32 on the shared vocabulary
    hidden: torch.Tensor  # (k, d) the hidden state a verifier reads


class Side:
    """A causal LM whose cache holds the first `held` tokens of the sequence."""

    def __init__(
        self, model: torch.nn.Module, vocab: int, device: torch.device, hidden_layer: int = -1
    ) -> None:
        self.model = model
        self.vocab = vocab
        self.device = device  # where the methods compare distributions (the target's)
        self.hidden_layer = hidden_layer
        self.own_device = next(model.parameters()).device
        self.cache = DynamicCache()
        # transformers 5.24 renamed the forward's `past_key_values` to `cache` (the old name
        # goes in 5.40); this folder runs on either, so it asks the model which it takes
        base = model.base_model
        self.cache_kwarg = (
            "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
        )
        self.held = 0
        self.calls = 0  # forwards after the prompt's prefill (the engine's count)

    @torch.inference_mode()
    def feed(self, sequence: list[int], drafts: list[int] | None = None) -> Outputs:
        """Feed what the cache lacks of `sequence`, then `drafts`; outputs at the position
        predicting each draft and the one past them: (len(drafts) + 1, ...)."""
        lack = sequence[self.held :]
        drafts = list(drafts or [])
        if not lack:
            raise ValueError("a forward needs the sequence's last token uncached")
        if self.held == 0 and len(lack) > 1:
            self._forward(lack[:-1])  # the prompt's prefill, its last token below
            lack = lack[-1:]
        final, chosen = self._forward(lack + drafts)
        self.calls += 1
        at = slice(len(lack) - 1, len(lack) + len(drafts))
        return self._outputs(final[at], chosen[at])

    @torch.inference_mode()
    def feed_one(self, token: int) -> Outputs:
        """One token after everything cached (a draft's next drafting step)."""
        final, chosen = self._forward([token])
        self.calls += 1
        return self._outputs(final, chosen)

    def crop(self, length: int) -> None:
        """Keep the first `length` tokens (drafts the target rejected leave)."""
        if length < self.held:
            self.cache.crop(length - self.held)  # a negative count: every transformers version
            self.held = length

    def _forward(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.tensor([tokens], dtype=torch.long, device=self.own_device)
        positions = torch.arange(self.held, self.held + len(tokens), device=self.own_device)
        out = self.model.base_model(
            input_ids=ids,
            position_ids=positions[None],
            use_cache=True,
            output_hidden_states=self.hidden_layer != -1,
            **{self.cache_kwarg: self.cache},
        )
        cache = getattr(out, "cache", None)
        self.cache = cache if cache is not None else out.past_key_values
        self.held += len(tokens)
        final = out.last_hidden_state[0]
        chosen = final if self.hidden_layer == -1 else out.hidden_states[self.hidden_layer][0]
        return final, chosen

    def _outputs(self, final: torch.Tensor, chosen: torch.Tensor) -> Outputs:
        logits = self.model.get_output_embeddings()(final)[..., : self.vocab].float()
        return Outputs(logits.to(self.device), chosen.to(self.device))
