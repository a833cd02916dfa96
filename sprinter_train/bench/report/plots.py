"""The bench's plots: tokens/s per method, goodput against batch size, the lossy frontier
(tokens/s against the perplexity ratio per lossy rule) and the quality-against-speed Pareto
plot over every run under the bench folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sprinter_train.bench.quality.frontier import RULES, on_frontier
from sprinter_train.core.io import read_json
from sprinter_train.core.plots import save, subplots


def plot_results(out: Path, bench_root: Path) -> None:
    """Tokens/s per method for this run, and the quality-vs-speed Pareto plot of every run."""
    results = read_json(out / "results.json")
    methods = results["methods"]
    fig, ax = subplots(figsize=(8, 4))
    names = list(methods)
    ax.bar(names, [methods[n]["tokens_per_s"] for n in names], color="tab:blue")
    ax.set_ylabel("tokens / s")
    ax.set_title(f"{results['experiment']}: decoding speed ({results['device']})")
    ax.tick_params(axis="x", rotation=45)
    save(fig, out / "tokens_per_s.png")
    plot_goodput(results, out / "goodput_vs_batch.png")
    plot_frontier(results, out / "frontier.png")

    points = []
    for path in sorted(bench_root.rglob("results.json")):
        data = read_json(path)
        tag = "" if path.parent == bench_root else path.parent.name
        for name, row in data["methods"].items():
            if row.get("speedup_vs_target_only") and row.get("rouge_l_vs_target") is not None:
                label = f"{name} {tag}".strip()
                points.append((row["speedup_vs_target_only"], row["rouge_l_vs_target"], label))
    if not points:
        return
    fig, ax = subplots(figsize=(7, 5))
    for x, y, label in points:
        ax.scatter(x, y)
        ax.annotate(label, (x, y), fontsize=7)
    frontier = _pareto(points)
    ax.plot([p[0] for p in frontier], [p[1] for p in frontier], "k--", lw=1, label="Pareto front")
    ax.set_xlabel("speedup over target_only (tokens/s ratio)")
    ax.set_ylabel("ROUGE-L against target_only output")
    ax.legend()
    save(fig, bench_root / "pareto.png")


def plot_goodput(results: dict[str, Any], path: Path) -> Path | None:
    """Tokens/s against batch size, one line per method (SV Fig. 3); a method measured at
    batch 1 only (HF's peers) is one marker. Nothing when a single batch size ran."""
    batches = results.get("batches") or {}
    if len(batches) < 2:
        return None
    sizes = sorted(int(b) for b in batches)
    fig, ax = subplots(figsize=(7, 4.5))
    names = dict.fromkeys(n for b in sizes for n in batches[str(b)]["methods"])
    colours = [f"C{i}" for i in range(10)]
    for index, name in enumerate(names):  # past ten methods the colours repeat: vary the dash
        points = [
            (b, batches[str(b)]["methods"][name]["tokens_per_s"])
            for b in sizes
            if name in batches[str(b)]["methods"]
        ]
        style = ("o-" if index < len(colours) else "o--") if len(points) > 1 else "s"
        colour = colours[index % len(colours)]
        ax.plot([x for x, _ in points], [y for _, y in points], style, color=colour, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("goodput (generated tokens / s)")
    ax.set_title(f"{results['experiment']}: goodput against batch size ({results['device']})")
    ax.legend(fontsize=7, ncol=2)
    return save(fig, path)


def plot_frontier(results: dict[str, Any], path: Path) -> Path | None:
    """The lossy frontier (results.json's `frontier`), one panel per batch size: tokens/s
    against the target's perplexity ratio to target_only, one series per rule through its
    timed points (hollow markers: a point the untimed pass alone measured, at that pass's
    speed, which is not a timed figure), the points on the frontier joined by a dashed line and
    the perplexity bar as a vertical line. Nothing when the frontier did not run."""
    entries, summary = results.get("frontier"), results.get("frontier_summary") or {}
    if not entries:
        return None
    untimed = summary.get("untimed_tokens_per_s") or [None] * len(entries)
    sizes = sorted({int(e["batch"]) for e in entries})
    fig, axes = subplots(1, len(sizes), figsize=(6.5 * len(sizes), 4.5), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        own = [(e, u) for e, u in zip(entries, untimed, strict=True) if e["batch"] == size]
        for index, rule in enumerate(RULES):
            colour = f"C{index}"
            timed = [e for e, _ in own if e["rule"] == rule and e["tokens_per_s"] is not None]
            timed = [e for e in timed if e["ppl_ratio"] is not None]
            if timed:
                timed.sort(key=lambda e: e["ppl_ratio"])
                xs, ys = [e["ppl_ratio"] for e in timed], [e["tokens_per_s"] for e in timed]
                ax.plot(xs, ys, "o-", color=colour, label=f"{rule} (timed)")
            rest = [
                (e["ppl_ratio"], u)
                for e, u in own
                if e["rule"] == rule
                and e["tokens_per_s"] is None
                and e["ppl_ratio"] is not None
                and u is not None
            ]
            if rest:
                ax.scatter(
                    [x for x, _ in rest],
                    [y for _, y in rest],
                    facecolors="none",
                    edgecolors=colour,
                    label=f"{rule} (untimed pass only)",
                )
        points = [e for e, _ in own]
        front = [e for e, on in zip(points, on_frontier(points), strict=True) if on]
        if front:
            front.sort(key=lambda e: e["ppl_ratio"])
            ax.plot(
                [e["ppl_ratio"] for e in front],
                [e["tokens_per_s"] for e in front],
                "k--",
                lw=1,
                label="frontier",
            )
        if summary.get("bar") is not None:
            ax.axvline(summary["bar"], color="grey", ls=":", label="perplexity bar")
        ax.set_xlabel("target perplexity / target_only's")
        ax.set_ylabel("tokens / s")
        ax.set_title(f"lossy frontier, batch {size}")
        ax.legend(fontsize=7)
    fig.suptitle(f"{results.get('experiment', '')} ({results.get('device', '')})")
    return save(fig, path)


def _pareto(points: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Points no other point beats on both speed and quality, by increasing speed."""
    front = [p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points)]
    return sorted(front)
