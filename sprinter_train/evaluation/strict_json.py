"""report.json stays strict JSON: NaN and infinities become null, numpy scalars plain numbers."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def strict_json(value: Any) -> Any:
    """NaN and infinities become None, recursively through dicts, lists and tuples."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value
