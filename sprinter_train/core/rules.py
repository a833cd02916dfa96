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

from sprinter_train.core.sampling import sample

Entropy = TypeVar("Entropy", float, np.ndarray, torch.Tensor)  # one H_q or many


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Leviathan et al.'s norm(max(0, p - q)): what a rejected position is resampled from.

    It has mass whenever a token was rejected (rejection needs q(x) > p(x)); numerically empty
    residuals fall back to p, the distribution the residual would renormalise towards.
    """
    residual = (p - q).clamp(min=0)
    total = float(residual.sum())
    return residual / total if total > 0 else p


def speculative_accept_length(
    p_rows: torch.Tensor, q_rows: torch.Tensor, drafts: Sequence[int], uniforms: torch.Tensor
) -> int:
    """How many leading drafts speculative sampling accepts: x_i passes when u_i < p_i(x)/q_i(x).

    p_rows, q_rows: (>= gamma, V); uniforms: (gamma,) U(0, 1) draws.
    """
    if not drafts:
        return 0
    index = torch.arange(len(drafts))
    tokens = torch.as_tensor(list(drafts))
    p_x = p_rows[index, tokens].double()
    q_x = q_rows[index, tokens].double()
    passed = uniforms.double() * q_x < p_x  # u < p/q without dividing by q
    rejected = (~passed).nonzero()
    return int(rejected[0]) if len(rejected) else len(drafts)


def speculative_step(
    p_rows: torch.Tensor,
    q_rows: torch.Tensor,
    drafts: Sequence[int],
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """One verification of speculative sampling (SVIP App. A, Alg. 2/4): (accepted, next token).

    p_rows: (gamma + 1, V) target distributions at each draft position and one past the last;
    q_rows: (gamma, V). The next token is a correction from norm(max(0, p - q)) at the first
    rejection, or a bonus token from p after gamma acceptances. Greedy decoding is the special
    case of one-hot p and q (accept iff the argmaxes agree, correct with the target's argmax).
    """
    device = generator.device if generator is not None else p_rows.device
    uniforms = torch.rand(len(drafts), generator=generator, device=device, dtype=torch.float64)
    n = speculative_accept_length(p_rows, q_rows, drafts, uniforms.to(p_rows.device))
    if n < len(drafts):
        return n, int(sample(residual_distribution(p_rows[n], q_rows[n]), generator))
    return n, int(sample(p_rows[n], generator))


def sprinter_verify_last(
    p: torch.Tensor, q: torch.Tensor, token: int, generator: torch.Generator | None
) -> int:
    """SPRINTER Alg. 2's target check of the token the verifier rejected: keep it with
    probability min(1, p(x)/q(x)), else draw from norm(max(0, p - q))."""
    device = generator.device if generator is not None else p.device
    u = torch.rand(1, generator=generator, device=device, dtype=torch.float64).to(p.device)
    if speculative_accept_length(p[None], q[None], [token], u):
        return token
    return int(sample(residual_distribution(p, q), generator))


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


def mtad_accept_length(
    p_rows: torch.Tensor, q_joint: Sequence[float], drafts: Sequence[int], tau: float
) -> int:
    """MTAD Alg. 1: the longest j whose joint ratio passes, min(1, p(x_1:j)/q(x_1:j)) > tau.

    p_rows: (>= gamma, V) target distributions; q_joint[j-1] = q(x_1:j | input), the draft's
    joint probability of the beam prefix. Returns 0 when no prefix passes.
    """
    best, p_joint = 0, 1.0
    for j, x in enumerate(drafts, start=1):
        p_joint *= float(p_rows[j - 1, x])
        q = float(q_joint[j - 1])
        ratio = 1.0 if q <= 0 else min(1.0, p_joint / q)
        if ratio > tau:
            best = j
    return best


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
