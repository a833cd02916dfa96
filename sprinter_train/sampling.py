"""One warping of logits (temperature, top-k, top-p) used for both p and q everywhere.

Speculative decoding is lossless only if the draft and target distributions it compares
are the ones actually sampled from, so harvest, evaluation and decoding all call this.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy (a one-hot distribution on the argmax)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    @classmethod
    def from_cfg(cls, cfg) -> SamplingConfig:
        return cls(
            float(cfg.get("temperature", 1.0)),
            int(cfg.get("top_k", 0) or 0),
            float(cfg.get("top_p", 1.0)),
        )

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def warp_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p; -inf logits (q = 0) stay at 0."""
    logits = logits.float()
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    logits = logits / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        kth = logits.topk(sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= sampling.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)
