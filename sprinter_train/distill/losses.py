"""Distillation losses on the teacher's cached top-k distribution.

`ce` is forward KL(p || q) up to the teacher's entropy (a constant); `tv` maximises
sum_x min(p(x), q(x)) over the teacher's top-k, a lower bound on the acceptance rate
alpha that speculative decoding actually gets. `top1` is the cross-entropy on the teacher's
most likely token: at the near-greedy default sampling (T 0.2, top-p 0.9) the warped p puts
nearly all its mass there, so agreeing on the argmax is what acceptance rewards.
"""

from __future__ import annotations

import torch


def slot_map(head_token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """vocab id -> position in the restricted head, -1 for ids the head cannot emit."""
    slots = torch.full((vocab_size,), -1, dtype=torch.long, device=head_token_ids.device)
    slots[head_token_ids] = torch.arange(head_token_ids.numel(), device=head_token_ids.device)
    return slots


def distill_loss(
    student_logits: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    teacher_indices: torch.Tensor,
    slots: torch.Tensor,
    ce_weight: float = 1.0,
    tv_weight: float = 1.0,
    top1_weight: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """student_logits (..., K) over the head set; teacher top-k (..., k) over the full vocab."""
    log_q = torch.log_softmax(student_logits.float(), dim=-1)
    teacher_slots = slots[teacher_indices.long()]
    valid = teacher_slots >= 0
    p = teacher_logprobs.float().exp() * valid
    log_q_at = log_q.gather(-1, teacher_slots.clamp(min=0))
    ce = -(p * log_q_at).sum(-1).mean()
    overlap = torch.minimum(p, log_q_at.exp()).sum(-1).mean()
    loss = ce_weight * ce + tv_weight * (1.0 - overlap)
    parts = {"ce": float(ce.detach()), "overlap_topk": float(overlap.detach())}
    if top1_weight:
        # the teacher's top-k is sorted: column 0 is its argmax (skipped where the head lacks it)
        top1_valid = valid[..., 0].float()
        top1 = -(log_q_at[..., 0] * top1_valid).sum() / top1_valid.sum().clamp(min=1.0)
        loss = loss + top1_weight * top1
        parts["top1_ce"] = float(top1.detach())
    return loss, parts
