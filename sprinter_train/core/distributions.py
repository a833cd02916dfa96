"""Distribution-level quantities shared by draft evaluation, harvest and distillation."""

from __future__ import annotations

import torch


def acceptance_alpha(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """alpha = sum_x min(p(x), q(x)) = 1 - TV(p, q): SD's expected acceptance per position."""
    return torch.minimum(p, q).sum(-1)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats; 0 log 0 = 0. One fused elementwise pass (`entr`): over a 49k
    vocabulary the log, mask and product as separate passes cost five times as long."""
    return torch.special.entr(probs).sum(-1)


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 of raw (untempered) logits, float32: the confidence vLLM's online
    acceptance estimator reads. -inf entries (tokens off a restricted head) never reach the top
    two while at least two are finite, so a head's K logits and their spread over the
    vocabulary give the same margin."""
    top = logits.float().topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def raw_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H(softmax(logits)) in nats at temperature 1, whatever sampling warps q with."""
    return entropy(logits.float().softmax(-1))


def implied_speedup(alpha: float, gamma: int, c: float, verify_cost: float) -> float:
    """Leviathan et al.: expected tokens per round (1 - a^(g+1))/(1 - a) over round cost g*c + v_g."""
    tokens = gamma + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)
    return tokens / (gamma * c + verify_cost)
