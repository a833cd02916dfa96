"""A per-draft-position logistic on the draft's top-2 margin, refitted from verify outcomes.

vLLM's online acceptance estimator (vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py)
predicts p_k = sigmoid(w_k * margin + b_k) for draft position k and learns w, b while
serving, with no training stage: each verified draft folds into per-position sufficient
statistics, the 2x2 information matrix sum pred (1 - pred) [m, 1]^T [m, 1] and the gradient
sum (y - pred) [m, 1], where pred is the prediction made when the draft was scored. Every
`refit_interval` observations each position takes one ridge-regularised Newton step,
theta += (info + l2 I)^-1 grad, from that round's statistics alone, which are then cleared
(so the fit tracks drift). A position with fewer than `min_observations` in the round keeps
its coefficients, and a step to a negative slope (a more decisive draft less likely
accepted) is refused. Until `warmup_refits` refits have happened, the scorer that owns the
estimator may answer a fixed score instead (vLLM verifies whole blocks meanwhile, so the
labels are not censored by its own trimming).

Deviations: vLLM counts its interval in scheduler steps; here it counts observations, so
the refit cadence does not depend on the batch size. Positions beyond `positions - 1` share
the last one's coefficients.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class OnlineLogistic:
    """The coefficients and the current round's statistics (float64, on the host)."""

    positions: int
    init_weight: float
    init_bias: float
    l2: float
    refit_interval: int
    min_observations: int
    warmup_refits: int
    weight: torch.Tensor = field(init=False)
    bias: torch.Tensor = field(init=False)
    info: torch.Tensor = field(init=False)  # (K, 2, 2) sum pred(1-pred) [m,1]^T [m,1]
    grad: torch.Tensor = field(init=False)  # (K, 2) sum (y - pred) [m, 1]
    counts: torch.Tensor = field(init=False)  # (K,) observations this round
    seen: int = 0  # observations since the last refit
    refits: int = 0

    def __post_init__(self) -> None:
        if self.positions < 1 or self.refit_interval < 1:
            raise ValueError("online logistic: positions and refit_interval must be >= 1")
        k = int(self.positions)
        self.weight = torch.full((k,), float(self.init_weight), dtype=torch.float64)
        self.bias = torch.full((k,), float(self.init_bias), dtype=torch.float64)
        self.info = torch.zeros((k, 2, 2), dtype=torch.float64)
        self.grad = torch.zeros((k, 2), dtype=torch.float64)
        self.counts = torch.zeros(k, dtype=torch.float64)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> OnlineLogistic:
        """From a method's `online` block (conf/methods/sd_online.yaml lists the keys)."""
        keys = (
            "positions",
            "init_weight",
            "init_bias",
            "l2",
            "refit_interval",
            "min_observations",
            "warmup_refits",
        )
        return cls(**{k: settings[k] for k in keys})

    @property
    def warm(self) -> bool:
        """Whether enough refits happened for its predictions to be trusted."""
        return self.refits >= int(self.warmup_refits)

    def slot(self, position: torch.Tensor | int) -> torch.Tensor:
        """Draft position -> coefficient index (deeper positions share the last)."""
        return torch.as_tensor(position, dtype=torch.long).clamp(0, self.positions - 1)

    def predict(self, margin: torch.Tensor, position: torch.Tensor | int) -> torch.Tensor:
        """sigmoid(w_k m + b_k), float64 on margin's device."""
        k = self.slot(position)
        w, b = self.weight[k], self.bias[k]
        m = margin.double()
        return torch.sigmoid(w.to(m.device) * m + b.to(m.device))

    def observe(
        self,
        margin: torch.Tensor,
        position: torch.Tensor | int,
        pred: torch.Tensor,
        label: torch.Tensor,
    ) -> None:
        """Fold verified drafts in (label 1 accepted, 0 rejected, or a probability); refit
        every `refit_interval` observations."""
        m = margin.detach().double().cpu().reshape(-1)
        k = self.slot(position).cpu().expand(m.shape[0]) if m.numel() else self.slot(position)
        p = pred.detach().double().cpu().reshape(-1)
        y = label.detach().double().cpu().reshape(-1)
        w = p * (1.0 - p)
        r = y - p
        design = torch.stack([m, torch.ones_like(m)], dim=1)  # (n, 2)
        self.info.index_add_(0, k, w[:, None, None] * design[:, :, None] * design[:, None, :])
        self.grad.index_add_(0, k, r[:, None] * design)
        self.counts.index_add_(0, k, torch.ones_like(m))
        self.seen += int(m.numel())
        if self.seen >= int(self.refit_interval):
            self.refit()

    def refit(self) -> None:
        """One Newton step per position from this round's statistics, then a clean round."""
        a = self.info[:, 0, 0] + self.l2
        b = self.info[:, 0, 1]
        c = self.info[:, 1, 1] + self.l2
        det = a * c - b * b
        g0, g1 = self.grad[:, 0], self.grad[:, 1]
        step_w = (c * g0 - b * g1) / det
        step_b = (a * g1 - b * g0) / det
        ok = torch.isfinite(det) & (det.abs() > 1e-12)
        ok &= torch.isfinite(step_w) & torch.isfinite(step_b)
        ok &= self.counts >= int(self.min_observations)
        new_w = torch.where(ok, self.weight + step_w, self.weight)
        new_b = torch.where(ok, self.bias + step_b, self.bias)
        keep = new_w >= 0.0
        self.weight = torch.where(keep, new_w, self.weight)
        self.bias = torch.where(keep, new_b, self.bias)
        self.info.zero_()
        self.grad.zero_()
        self.counts.zero_()
        self.seen = 0
        self.refits += 1

    def state(self) -> dict[str, Any]:
        """What a bench record says of it."""
        return {
            "weight": self.weight.tolist(),
            "bias": self.bias.tolist(),
            "refits": self.refits,
        }


def top2_margin(values: torch.Tensor) -> torch.Tensor:
    """(B,) top-1 minus top-2 of each row (0 when the maximum is tied; a one-entry row's
    margin is its value's distance to nothing and is taken as 0)."""
    if values.shape[-1] < 2:
        return torch.zeros(values.shape[:-1], dtype=torch.float32, device=values.device)
    top = values.float().topk(2, dim=-1).values
    margin = top[..., 0] - top[..., 1]
    return torch.nan_to_num(margin, nan=0.0, posinf=MAX_MARGIN, neginf=0.0).clamp(max=MAX_MARGIN)


MAX_MARGIN = 40.0  # vLLM's cap: a row with one finite logit would give an unbounded margin
