"""The acceptance and stopping rules of the papers as pure functions, named as there.

Everything here takes distributions already warped (temperature, top-k, top-p) the same way
for p and q; the engine and the unit tests call these and nothing else decides acceptance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch

from sprinter_train.core.sampling import inverse_cdf

Entropy = TypeVar("Entropy", float, np.ndarray, torch.Tensor)  # one H_q or many


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
    # each row's distributions at its first rejection (or bonus) picked as whole rows: a
    # gather along the drafts reads an index per vocabulary entry (six times slower on a CPU)
    rows = torch.arange(B, device=p.device)
    p_n = p.reshape(B * G1, V).index_select(0, rows * G1 + accepted)
    q_n = q.reshape(B * (G1 - 1), V).index_select(0, rows * (G1 - 1) + accepted.clamp(max=G1 - 2))
    rejected = (accepted < counts)[:, None]
    return accepted, torch.where(rejected, residual_rows(p_n, q_n), p_n)


def speculative_step(
    p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, counts: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`speculative_rows` with its next token drawn: (accepted (B,), token (B,)).

    u: (B, G + 1) the row's next numbers: u[r, :G] test its drafts, u[r, counts[r]] (the
    number after the tests it used) draws from the law."""
    accepted, law = speculative_rows(p, q, drafts, counts, u[:, :-1])
    return accepted, inverse_cdf(law, u.gather(1, counts[:, None])[:, 0])


def sprinter_check_rows(
    p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, u: torch.Tensor, u_fresh: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """SPRINTER Alg. 2's target check of the token each row's verifier rejected: keep x with
    probability min(1, p(x)/q(x)), else draw from norm(max(0, p - q)). (kept (B,), token (B,))

    p, q: (B, V) at the rejected position; u, u_fresh: (B,) uniforms for the test and the draw.
    """
    p_x = p.gather(1, x[:, None])[:, 0]
    q_x = q.gather(1, x[:, None])[:, 0]
    kept = u.double() * q_x.double() < p_x.double()
    fresh = inverse_cdf(residual_rows(p, q), u_fresh)
    return kept, torch.where(kept, x, fresh)


def _entropy_bound(draft_entropy: Entropy, constant: float) -> Entropy:
    """1 - sqrt(constant H_q), elementwise; an H_q below 0 (rounding) counts as 0."""
    if isinstance(draft_entropy, torch.Tensor):
        return 1.0 - (constant * draft_entropy.clamp(min=0.0)).sqrt()
    if isinstance(draft_entropy, np.ndarray):
        return 1.0 - np.sqrt(constant * np.maximum(draft_entropy, 0.0))
    return 1.0 - math.sqrt(constant * max(float(draft_entropy), 0.0))


def svip_score(draft_entropy: Entropy, c: float) -> Entropy:
    """SVIP §2.2 eq. (6): a token's acceptance probability is at least 1 - sqrt(c H_q).

    c comes from conf/methods/svip.yaml (the authors' value). Not clipped at 0 (it is
    negative at high entropy): clipping would tie those tokens and flatten an ROC.
    """
    return _entropy_bound(draft_entropy, c)


def svip_should_stop(
    draft_entropy: Entropy, h: float, c: float
) -> bool | np.ndarray | torch.Tensor:
    """SVIP Alg. 1 line 7 in the authors' form, stop drafting when sqrt(c H_q) > h, i.e. when
    the score falls below 1 - h."""
    return svip_score(draft_entropy, c) < 1.0 - h


def adaedl_score(draft_entropy: Entropy, gamma: float) -> Entropy:
    """AdaEDL's entropy lower bound on a token's acceptance probability, 1 - sqrt(gamma H_q)."""
    return _entropy_bound(draft_entropy, gamma)


def adaedl_should_stop(
    draft_entropy: Entropy, gamma: float, lam: float
) -> bool | np.ndarray | torch.Tensor:
    """AdaEDL: stop drafting when the bound on the token's acceptance falls below lambda."""
    return adaedl_score(draft_entropy, gamma) < lam


def heuristic_next_gamma(gamma: int, accepted: int, drafted: int, minimum: int = 1) -> int:
    """Hugging Face's heuristic schedule: +2 when every drafted token was accepted, else -1."""
    return gamma + 2 if accepted == drafted else max(minimum, gamma - 1)


def sprinter_continue(score: float, tau: float) -> bool:
    """SPRINTER Alg. 2: keep drafting while the verifier's score V(s(x, prefix)) >= tau."""
    return score >= tau


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


def sv_prob_accept_count(P: Sequence[float], gamma: int) -> list[float]:
    """SV eq. (3): P_gamma(N = n) for n = 0..gamma from per-token acceptance P(T_i | S, A)."""
    probs, prefix = [], 1.0
    for n in range(gamma + 1):
        stop = (1.0 - P[n]) if n < gamma else 1.0
        probs.append(prefix * stop)
        if n < gamma:
            prefix *= P[n]
    return probs


def sv_expected_accepted(P: Sequence[float], gamma: int) -> float:
    """SV eq. (4): E(N | gamma) = sum_i i P_gamma(N = i)."""
    return sum(n * prob for n, prob in enumerate(sv_prob_accept_count(P, gamma)))


def sv_goodput(P: Sequence[float], gamma: int, latency_s: float) -> float:
    """SV eq. (6): estimated tokens per second of a round that verifies gamma drafts.

    A round emits E(N | gamma) accepted drafts plus the one token the target always adds (a
    correction or a bonus); counting it keeps gamma = 0 comparable with drafting at all.
    """
    return (sv_expected_accepted(P, gamma) + 1.0) / latency_s


def sampled_acceptance(accept_prob: np.ndarray, seed: int) -> np.ndarray:
    """Speculative sampling's accept event on records: u < min(1, p/q), u ~ U(0, 1) seeded.

    One definition for SV's table entropies and the evaluation's sampled label: the same
    seed gives the same events in both.
    """
    u = np.random.default_rng(seed).random(len(accept_prob))
    return u < np.asarray(accept_prob, dtype=np.float64)
