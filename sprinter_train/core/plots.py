"""Plots people would rather look at than read (headless matplotlib)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_curve(curve: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    """Training loss and held-out alpha against tokens seen."""
    if not curve:
        return None
    fig, left = plt.subplots(figsize=(7, 4))
    tokens = [p["tokens"] / 1e6 for p in curve]
    left.plot(tokens, [p["loss"] for p in curve], color="tab:blue", label="train loss")
    left.set_xlabel("tokens seen (M)")
    left.set_ylabel("loss", color="tab:blue")
    evals = [p for p in curve if "heldout_alpha_t1" in p]
    if evals:
        right = left.twinx()
        right.plot(
            [p["tokens"] / 1e6 for p in evals],
            [p["heldout_alpha_t1"] for p in evals],
            "o-",
            color="tab:red",
            label="held-out alpha (T=1)",
        )
        right.set_ylabel("held-out alpha, T=1", color="tab:red")
    left.set_title(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
