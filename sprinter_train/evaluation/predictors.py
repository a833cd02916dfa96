"""The baseline acceptance predictors that need no training.

Each returns an estimate of P(accept) per record. The entropy bounds are not clipped (they
can be negative at high entropy): clipping at 0 would tie every such record and flatten the
ROC; ECE and Brier clip scores to [0, 1] themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sprinter_train.core import rules


def svip_score(draft_entropy: np.ndarray, svip: Mapping[str, Any]) -> np.ndarray:
    """SVIP's 1 - sqrt(c H_q) with the c of `cfg.methods.svip`, the one the svip policy stops
    on (when this falls below 1 - h), so evaluate scores the rule the bench runs."""
    return rules.svip_score(np.asarray(draft_entropy, dtype=np.float64), float(svip["c"]))


def adaedl_bound(draft_entropy: np.ndarray, adaedl: Mapping[str, Any]) -> np.ndarray:
    """AdaEDL's 1 - sqrt(γ H_q) with the γ of `cfg.methods.adaedl`, the adaedl policy's."""
    return rules.adaedl_score(np.asarray(draft_entropy, dtype=np.float64), float(adaedl["gamma"]))


def draft_q(q: np.ndarray) -> np.ndarray:
    """The draft's own probability of the token it drafted."""
    return np.asarray(q, dtype=np.float64)
