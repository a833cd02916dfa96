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


def implied_speedup(alpha: float, gamma: int, c: float, verify_cost: float) -> float:
    """Leviathan et al.: expected tokens per round (1 - a^(g+1))/(1 - a) over round cost g*c + v_g."""
    tokens = gamma + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)
    return tokens / (gamma * c + verify_cost)
