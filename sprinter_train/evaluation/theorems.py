"""SPRINTER's theorems (§3.1, App. A.4) as pure functions, named as in the paper.

The verifier accepts an acceptable token (q(x) <= p(x)) with probability η_TP and an
unacceptable one with probability η_FP, independently of everything else (the paper's i.i.d.
assumption). r is the number of consecutive acceptable draft tokens, t_d the draft's time
per token.
"""

from __future__ import annotations

import numpy as np


def d_TV(p: np.ndarray, q: np.ndarray) -> float | np.ndarray:
    """Total-variation distance 1/2 sum_x |p(x) - q(x)| (over the last axis)."""
    return 0.5 * np.abs(np.asarray(p, dtype=np.float64) - np.asarray(q, dtype=np.float64)).sum(-1)


def p_SPRINTER(p: np.ndarray, q: np.ndarray, eta_FP: float) -> np.ndarray:
    """Theorem 3.1 (2): the distribution of a token emitted by SPRINTER."""
    return (1.0 - eta_FP) * np.asarray(p, dtype=np.float64) + eta_FP * np.asarray(q, np.float64)


def d_TV_SPRINTER(p: np.ndarray, q: np.ndarray, eta_FP: float) -> float | np.ndarray:
    """Theorem 3.1: d_TV(p, p_SPRINTER) = η_FP d_TV(p, q)."""
    return eta_FP * d_TV(p, q)


def P_N(i: int, eta_TP: float, eta_FP: float, r: int) -> float:
    """Theorem 3.3: P(N_SPRINTER = i), N the number of consecutive verifier accepts."""
    if i < 0:
        return 0.0
    if i < r:
        return eta_TP**i * (1.0 - eta_TP)
    return eta_TP**r * eta_FP ** (i - r) * (1.0 - eta_FP)


def _geometric_part(eta_TP: float, r: int) -> float:
    """(η_TP - η_TP^r) / (1 - η_TP), with its limit r - 1 at η_TP = 1."""
    if eta_TP == 1.0:
        return float(r - 1)
    return (eta_TP - eta_TP**r) / (1.0 - eta_TP)


def E_N(eta_TP: float, eta_FP: float, r: int) -> float:
    """Theorem 3.3 (3): E[N_SPRINTER] = (η_TP - η_TP^r)/(1 - η_TP) + η_TP^r/(1 - η_FP)."""
    if eta_FP >= 1.0:
        return float("inf") if eta_TP**r > 0 else _geometric_part(eta_TP, r)
    return _geometric_part(eta_TP, r) + eta_TP**r / (1.0 - eta_FP)


def E_T_stop(eta_TP: float, eta_FP: float, r: int, t_d: float) -> float:
    """Theorem 3.4 (4): E[T_stop] = (1 - η_TP^r) t_d/(1 - η_TP) + η_TP^r t_d/(1 - η_FP)."""
    first = float(r) * t_d if eta_TP == 1.0 else (1.0 - eta_TP**r) * t_d / (1.0 - eta_TP)
    if eta_FP >= 1.0:
        return float("inf") if eta_TP**r > 0 else first
    return first + eta_TP**r * t_d / (1.0 - eta_FP)


def E_N_truncated(eta_TP: float, eta_FP: float, r: int, L: int) -> float:
    """E[min(N_SPRINTER, L)] under Theorem 3.3's distribution: the run a verifier can show
    when only L tokens remain in a recorded sequence (L = inf gives E[N])."""
    if not np.isfinite(L):
        return E_N(eta_TP, eta_FP, r)
    L = int(L)
    below = [P_N(i, eta_TP, eta_FP, r) for i in range(L)]
    return float(sum(i * prob for i, prob in enumerate(below)) + L * max(0.0, 1.0 - sum(below)))


def beta_SD(d_tv: float) -> float:
    """Leviathan et al. (33): speculative sampling's acceptance rate, 1 - d_TV(p, q)."""
    return 1.0 - d_tv


def beta_SPRINTER(eta_FP: float, d_tv: float) -> float:
    """Theorem A.4 (34): SPRINTER's acceptance rate, 1 - (1 - η_FP) d_TV(p, q)."""
    return 1.0 - (1.0 - eta_FP) * d_tv
