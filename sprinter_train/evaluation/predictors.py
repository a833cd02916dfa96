"""The baseline acceptance predictors that need no training, and the sampled acceptance event.

Each returns an estimate of P(accept) per record. The entropy bounds are not clipped (they
can be negative at high entropy): clipping at 0 would tie every such record and flatten the
ROC; ECE and Brier clip scores to [0, 1] themselves.
"""

from __future__ import annotations

import numpy as np


def svip_score(draft_entropy: np.ndarray, c: float = 0.15) -> np.ndarray:
    """SVIP §2.2 eq. (6): acceptance >= 1 - sqrt(c H_q); the authors' code stops drafting when
    sqrt(c H_q) > h with c = 0.15, i.e. when this estimate falls below 1 - h."""
    return 1.0 - np.sqrt(c * np.asarray(draft_entropy, dtype=np.float64))


def adaedl_bound(draft_entropy: np.ndarray, gamma: float) -> np.ndarray:
    """AdaEDL's entropy lower bound on the acceptance probability, 1 - sqrt(γ H_q)."""
    return 1.0 - np.sqrt(gamma * np.asarray(draft_entropy, dtype=np.float64))


def draft_q(q: np.ndarray) -> np.ndarray:
    """The draft's own probability of the token it drafted."""
    return np.asarray(q, dtype=np.float64)


def sampled_acceptance(accept_prob: np.ndarray, seed: int) -> np.ndarray:
    """Speculative sampling's accept event: u < min(1, p/q) with u ~ U(0, 1) from a seeded RNG."""
    u = np.random.default_rng(seed).random(len(accept_prob))
    return u < np.asarray(accept_prob, dtype=np.float64)
