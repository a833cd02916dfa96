"""The sampling the engine uses, for the exported methods: one warping of p and q, the
inverse-CDF draw, speculative sampling's residual and the entropy.

A copy of sprinter_train/core/sampling.py's `warp_probs` and `inverse_cdf` and of
core/rules.py's `residual_rows` (this package imports nothing from sprinter_train: it is
copied verbatim into exported folders). tests/test_hf_export.py checks the copies agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """temperature 0 means greedy (a one-hot distribution on the argmax)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


def warp_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p; -inf logits (q = 0) stay at 0."""
    logits = logits.float()
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    logits = logits / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        kth = logits.topk(sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if sampling.top_p < 1.0:
        probs = _nucleus(probs, sampling.top_p)
    return probs


def _nucleus(probs: torch.Tensor, top_p: float, k: int = 64) -> torch.Tensor:
    """Keep the smallest top set whose mass reaches top_p (the first token always stays),
    renormalised; found with a top-k that grows until the nucleus fits in it."""
    vocab = probs.shape[-1]
    while True:
        k = min(k, vocab)
        values, index = probs.topk(k, dim=-1)
        keep = (values.cumsum(-1) - values) < top_p
        if k == vocab or not bool(keep[..., -1].any()):
            break
        k *= 4
    kept = values * keep
    out = torch.zeros_like(probs).scatter_(-1, index, kept)
    return out / kept.sum(-1, keepdim=True)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token at uniform u in [0, 1) of each row of (..., V) probabilities: the first whose
    cumulative mass exceeds u times the row's total; never a zero-probability token."""
    cdf = probs.double().cumsum(-1)
    point = (u.to(cdf) * cdf[..., -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, point, right=True).squeeze(-1)
    last = probs.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(-1)
    return torch.minimum(index, last)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)); a numerically empty residual falls back to p."""
    rest = (p - q).clamp(min=0)
    total = rest.sum(-1, keepdim=True)
    return torch.where(total > 0, rest / total.clamp(min=1e-30), p)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats; 0 log 0 = 0."""
    logs = torch.where(probs > 0, probs.log(), torch.zeros_like(probs))
    return -(probs * logs).sum(-1)


def uniform(device: torch.device, generator: torch.Generator | None = None) -> torch.Tensor:
    """One float64 uniform in [0, 1) on `device` (torch's global generator unless given)."""
    where = generator.device if generator is not None else device
    return torch.rand((), generator=generator, device=where, dtype=torch.float64).to(device)
