"""Evaluation figures: ROC curves, reliability diagrams, the SV table as a heat map."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sprinter_train.core.plots import save, subplots


def plot_roc(curves: dict[str, dict[str, Any]], path: Path, title: str) -> Path:
    """One ROC curve per entry {name: {fpr, tpr, auc, ci (optional [lo, hi])}}; the diagonal
    is chance."""
    fig, ax = subplots(figsize=(5.5, 5))
    for name, curve in curves.items():
        if not curve.get("fpr"):
            continue
        value, ci = curve.get("auc"), curve.get("ci")
        label = name
        if value is not None:
            interval = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
            label = f"{name} (AUC {value:.3f}{interval})"
        ax.plot(curve["fpr"], curve["tpr"], label=label)
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("false-positive rate (η_FP)")
    ax.set_ylabel("true-positive rate (η_TP)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    return save(fig, path)


def plot_reliability(panels: dict[str, dict[str, dict[str, list]]], path: Path) -> Path:
    """Observed rate against mean predicted probability per bin; one panel per label."""
    fig, axes = subplots(1, len(panels), figsize=(5.2 * len(panels), 4.8), squeeze=False)
    for ax, (label, tables) in zip(axes[0], panels.items(), strict=True):
        for name, table in tables.items():
            points = [
                (m, r)
                for m, r, c in zip(table["mean_prob"], table["rate"], table["count"], strict=True)
                if c
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, "o-", markersize=3, label=name)
        ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("predicted P(accept)")
        ax.set_ylabel("observed frequency")
        ax.set_title(f"reliability against {label}")
        ax.legend(fontsize=7)
    return save(fig, path)


def _occupied(table: dict[str, list]) -> tuple[list[float], list[float]]:
    """(mean predicted, observed) of the bins that hold records."""
    points = [
        (m, r)
        for m, r, c in zip(table["mean_prob"], table["rate"], table["count"], strict=True)
        if c
    ]
    xs, ys = zip(*points, strict=True) if points else ((), ())
    return list(xs), list(ys)


def plot_calibration(entries: dict[str, dict[str, Any]], path: Path) -> Path:
    """Each verifier's reliability before (dashed, x) and after (solid, o) its temperature, one
    colour per verifier; left against its own target, right against the sampled accept event."""
    panels = (
        ("own_target", "its own target (q/p <= λ; min(1, p/q) for the soft label)"),
        ("sampled", "the sampled accept event"),
    )
    fig, axes = subplots(1, 2, figsize=(10.4, 4.8))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for index, (name, entry) in enumerate(entries.items()):
            tables = entry["reliability"][key]
            colour = f"C{index}"
            ax.plot(*_occupied(tables["before"]), "x--", color=colour, markersize=4, alpha=0.6)
            label = f"{name} (T = {entry['temperature']:.2f})"
            ax.plot(*_occupied(tables["after"]), "o-", color=colour, markersize=3, label=label)
        ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("predicted P(accept) (dashed: before, solid: after the temperature)")
        ax.set_ylabel("observed frequency")
        ax.set_title(f"against {title}", fontsize=9)
        ax.legend(fontsize=7)
    return save(fig, path)


def _edge_labels(edges: list[float], most: int = 9) -> tuple[np.ndarray, list[str]]:
    ticks = np.arange(len(edges))
    keep = np.unique(np.linspace(0, len(edges) - 1, min(most, len(edges))).round().astype(int))
    return ticks[keep] - 0.5, [f"{edges[k]:.2f}" for k in keep]


def plot_sv_table(entry: dict[str, Any], path: Path, title: str) -> Path:
    """P(accept | S, A) per cell, drawn in cell-index space with the edges as tick labels
    (adaptive cells differ in width; a cell at A = 1 has zero width)."""
    value = np.asarray(entry["p_accept"], dtype=np.float64)
    counts = np.asarray(entry["counts"])
    fig, axes = subplots(1, 2, figsize=(11, 4.6))
    image = axes[0].imshow(value, origin="lower", aspect="auto", vmin=0, vmax=1, cmap="viridis")
    fig.colorbar(image, ax=axes[0], label="P(accept | S, A)")
    shown = np.log10(np.maximum(counts, 1))
    image = axes[1].imshow(shown, origin="lower", aspect="auto", cmap="magma")
    fig.colorbar(image, ax=axes[1], label="log10 records per cell")
    for ax, name in zip(axes, ("P(accept)", "records"), strict=True):
        ticks, labels = _edge_labels(entry["a_edges"])
        ax.set_xticks(ticks, labels, rotation=45, fontsize=7)
        ticks, labels = _edge_labels(entry["s_edges"])
        ax.set_yticks(ticks, labels, fontsize=7)
        ax.set_xlabel("A = min(1, P_c(x) / P_d(x))")
        ax.set_ylabel("S = sum min(P_d, P_c)")
        ax.set_title(f"{title}: {name}")
    return save(fig, path)


def plot_sv_calibration(
    predicted: np.ndarray, observed: np.ndarray, counts: np.ndarray, path: Path
) -> Path:
    """Per occupied cell: the table's P(accept) (fitted on train) against the test mean."""
    keep = counts > 0
    fig, ax = subplots(figsize=(5, 5))
    ax.scatter(
        predicted[keep], observed[keep], s=8 + 40 * counts[keep] / max(counts.max(), 1), alpha=0.6
    )
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("table P(accept | S, A) (fit split)")
    ax.set_ylabel("mean min(1, p/q) in the cell (test split)")
    ax.set_title("SV table calibration (marker size: test records)")
    return save(fig, path)


def plot_learning_curves(curves: dict[str, dict[str, Any]], path: Path, target: float) -> Path:
    """Test (solid) and val (dashed) AUC against train records, log2 axis, one colour per
    verifier; the dotted line is the target AUC (`evaluate.target_auc`). Where no AUC is
    defined (one class only, as at T = 0 when every draft is accepted) the figure says so:
    a log axis over no data cannot be drawn."""
    fig, ax = subplots(figsize=(6, 4.5))
    defined = any(
        p[k] is not None
        for entry in curves.values()
        for p in entry["points"]
        for k in ("test_auc_q_le_p", "val_auc_q_le_p")
    )
    if not defined:
        ax.text(0.5, 0.5, "no AUC defined: the rows hold one class only", ha="center")
        ax.set_axis_off()
        return save(fig, path)
    for index, (name, entry) in enumerate(curves.items()):
        points = entry["points"]
        rows = [p["train_rows"] for p in points]
        colour = f"C{index}"
        test, val = (
            [np.nan if p[k] is None else p[k] for p in points]
            for k in ("test_auc_q_le_p", "val_auc_q_le_p")
        )
        ax.plot(rows, test, "o-", color=colour, label=name)
        ax.plot(rows, val, "s--", color=colour, alpha=0.5)
    ax.axhline(target, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("train records")
    ax.set_ylabel("AUC against q/p <= 1 (solid: test, dashed: val)")
    ax.set_title("verifier AUC against training records")
    ax.legend(fontsize=8, loc="lower right")
    return save(fig, path)
