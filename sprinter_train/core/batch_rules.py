"""The acceptance rules vectorised over the rows of a batch, each row exactly its scalar rule.

Every function takes warped distributions and per-row uniforms (core.streams) and returns
per-row tensors on the same device: nothing here reads a value back to the host.
"""

from __future__ import annotations

import torch


def sample_rows(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """(B,) tokens from (B, V) probabilities by inverse CDF with one uniform per row.

    torch.multinomial costs ~1 ms on a 49k vocabulary on CPU; a cumulative sum and a binary
    search cost a few microseconds. A zero-probability token is never drawn.
    """
    cdf = probs.double().cumsum(-1)
    index = torch.searchsorted(cdf, (u.to(cdf.device) * cdf[:, -1])[:, None], right=True)[:, 0]
    last = probs.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(-1)
    return torch.minimum(index, last)


def residual_rows(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Leviathan et al.'s norm(max(0, p - q)) per row; a numerically empty residual (only
    possible when nothing was rejected) falls back to p."""
    residual = (p - q).clamp(min=0)
    total = residual.sum(-1, keepdim=True)
    return torch.where(total > 0, residual / total.clamp(min=1e-30), p)


def accept_lengths(
    p_x: torch.Tensor, q_x: torch.Tensor, u: torch.Tensor, counts: torch.Tensor
) -> torch.Tensor:
    """(B,) how many leading drafts pass u_j < p_j(x_j)/q_j(x_j), among each row's counts[r].

    p_x, q_x, u: (B, G) the drafted tokens' probabilities and one uniform per draft.
    """
    passed = u.double() * q_x.double() < p_x.double()
    passed &= torch.arange(p_x.shape[1], device=p_x.device)[None, :] < counts[:, None]
    return passed.long().cumprod(1).sum(1)


def speculative_rows(
    p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, counts: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling's verification for every row: (accepted (B,), next-token law (B, V)).

    p: (B, G + 1, V) target distributions at each draft position and one past the last;
    q: (B, G, V); drafts: (B, G); row r drafted counts[r] <= G tokens. The next token is a
    correction from norm(max(0, p - q)) at the first rejection, or a bonus from p after all
    of the row's drafts passed. Greedy decoding is the special case of one-hot p and q.
    """
    B, G1, V = p.shape
    if G1 == 1:
        return torch.zeros(B, dtype=torch.long, device=p.device), p[:, 0]
    p_x = p[:, :-1].gather(2, drafts[..., None])[..., 0]
    q_x = q.gather(2, drafts[..., None])[..., 0]
    accepted = accept_lengths(p_x, q_x, u, counts)
    at = accepted[:, None, None].expand(-1, 1, V)
    p_n = p.gather(1, at)[:, 0]
    q_n = q.gather(1, at.clamp(max=G1 - 2))[:, 0]
    rejected = (accepted < counts)[:, None]
    return accepted, torch.where(rejected, residual_rows(p_n, q_n), p_n)


def mtad_accept_lengths(
    p_x: torch.Tensor, q_joint: torch.Tensor, counts: torch.Tensor, tau: float
) -> torch.Tensor:
    """MTAD Alg. 1 per row: the longest j <= counts[r] with min(1, p(x_1:j)/q(x_1:j)) > tau
    (0 if none).

    p_x: (B, G) target probabilities of the beam's tokens; q_joint: (B, G) the draft's joint
    probability of each beam prefix.
    """
    p_joint = p_x.double().cumprod(1)
    q = q_joint.double()
    ratio = torch.where(q > 0, (p_joint / q.clamp(min=1e-300)).clamp(max=1.0), 1.0)
    positions = torch.arange(1, p_x.shape[1] + 1, device=p_x.device)
    passed = (ratio > tau) & (positions[None, :] <= counts[:, None])
    return (passed * positions).max(1).values
