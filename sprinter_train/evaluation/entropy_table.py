"""SVIP Table 1: the draft's entropy at accepted and at rejected tokens.

SVIP's stopping rule rests on rejected tokens having the higher draft entropy; the report
shows whether these records agree.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def entropy_table(frame: pd.DataFrame, y_event: np.ndarray, y_label: np.ndarray) -> dict[str, Any]:
    """Mean draft entropy (nats) at accepted and at rejected draft tokens."""
    h = frame["draft_entropy"].to_numpy(dtype=np.float64)

    def mean(mask: np.ndarray) -> float | None:
        return float(h[mask].mean()) if mask.any() else None

    return {
        "entropy_accepted": mean(y_event),
        "entropy_rejected": mean(~y_event),
        "by_label": {"q_le_p": mean(y_label), "q_gt_p": mean(~y_label)},
        "unit": "nats",
        "accepted_means": "the sampled accept event u < min(1, p/q)",
    }
