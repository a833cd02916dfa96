"""One warping of logits (temperature, top-k, top-p) used for both p and q everywhere.

Speculative decoding is lossless only if the draft and target distributions it compares
are the ones actually sampled from, so harvest, evaluation and decoding all call this.
"""

from __future__ import annotations

import functools
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
    probs = logits.softmax(-1)
    if sampling.top_p < 1.0:
        probs = _nucleus(probs, sampling.top_p)
    return probs


def _nucleus(probs: torch.Tensor, top_p: float, k: int = 64) -> torch.Tensor:
    """Keep the smallest top set whose mass reaches top_p (a token is dropped when the mass
    before it already reaches top_p; the first always stays), renormalised.

    A full sort of a large vocabulary costs a CPU longer than a draft step (docs/results/
    design-figures.md, "Sampling on a CPU"), so the nucleus is found with a top-k that grows until every row's nucleus fits in it. On an
    accelerator the full sort is cheap and checking whether the top-k sufficed would be a host
    synchronisation every warp, so there it sorts everything at once.
    """
    vocab = probs.shape[-1]
    if probs.device.type != "cpu":
        k = vocab
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


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Tokens drawn from (V,) or (N, V) probabilities: a () or (N,) long tensor.

    One uniform per row, all from a single torch.rand call, so row i takes the generator's
    i-th number: its token depends on its own probabilities and its place in the stream, never
    on the other rows' probabilities. Inverse CDF: a cumulative sum and a binary search cost a CPU
    far less than torch.multinomial (docs/results/design-figures.md, "Sampling on a CPU").
    """
    device = generator.device if generator is not None else probs.device
    u = torch.rand(probs.shape[:-1], generator=generator, device=device, dtype=torch.float64)
    return inverse_cdf(probs, u.to(probs.device))


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token at uniform u in [0, 1) of each row of (..., V) probabilities (unnormalised is
    fine): the first whose cumulative mass exceeds u times the row's total. A zero-probability
    token is never returned, even when rounding puts u * total at the total."""
    cdf = probs.cumsum(-1, dtype=torch.float64)
    point = (u.to(cdf) * cdf[..., -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, point, right=True).squeeze(-1)
    # the last token with mass (the row's last token if none has any) as the highest rank
    # among them: half the time of an argmax over the flipped mask, and the engine draws at
    # every drafting step
    vocab = probs.shape[-1]
    last = ((probs > 0) * _ranks(vocab, probs.device)).amax(-1) - 1
    return torch.minimum(index, last % vocab)


@functools.lru_cache(maxsize=8)
def _ranks(vocab: int, device: torch.device) -> torch.Tensor:
    """1 .. vocab as int32 (made once: `inverse_cdf` runs for every draw)."""
    with torch.inference_mode(False):
        return torch.arange(1, vocab + 1, dtype=torch.int32, device=device)
