"""Plots people would rather look at than read, drawn headless without touching pyplot.

Figures are matplotlib.figure.Figure objects, which render to PNG through Agg on their own:
importing this module selects no backend (a notebook or GUI caller keeps its own), and no
figure is left in pyplot's registry to be closed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure


def subplots(
    nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], squeeze: bool = True
) -> tuple[Figure, Any]:
    """A new figure and its axes, as pyplot.subplots returns them."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, squeeze=squeeze)


def save(fig: Figure, path: Path, dpi: int = 110) -> Path:
    """Lay out and write `fig` as an image, creating the folder."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    return Path(path)


def plot_curve(curve: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    """Training loss and held-out alpha against tokens seen."""
    if not curve:
        return None
    fig, left = subplots(figsize=(7, 4))
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
    return save(fig, path)
