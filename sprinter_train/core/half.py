"""Values stored in float16 (the records' hidden states, the verifier's dense features) are
clamped to its range first, so a large one stays finite instead of becoming inf."""

from __future__ import annotations

import torch

FLOAT16_MAX = float(torch.finfo(torch.float16).max)


def as_record_half(values: torch.Tensor) -> torch.Tensor:
    """float16 as records store hidden states: clamped to float16's range first (no inf)."""
    return values.float().clamp(-FLOAT16_MAX, FLOAT16_MAX).to(torch.float16)
