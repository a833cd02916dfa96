"""The bench's outputs: results.json, results.md (the table people read) and plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sprinter_train.core.io import read_json, write_json
from sprinter_train.core.plots import save, subplots

COLUMNS = [
    ("tokens/s", "tokens_per_s", "{:.1f}"),
    ("× target_only", "speedup_vs_target_only", "{:.2f}"),
    ("× sd", "speedup_vs_sd", "{:.2f}"),
    ("target calls", "target_calls", "{:d}"),
    ("draft calls", "draft_calls", "{:d}"),
    ("tokens / target call", "tokens_per_target_call", "{:.2f}"),
    ("acceptance", "acceptance_rate", "{:.3f}"),  # drafts the target checked and kept
    ("verifier acceptance", "verifier_acceptance_rate", "{:.3f}"),  # committed unchecked
    ("ROUGE-L ref", "rouge_l_ref", "{:.1f}"),
    ("ROUGE-L vs target", "rouge_l_vs_target", "{:.1f}"),
    ("target PPL", "target_ppl", "{:.2f}"),
]


def _cell(value: Any, fmt: str) -> str:
    if value is None or value != value:
        return "–"
    return fmt.format(value)


def results_table(results: dict[str, Any]) -> str:
    """One markdown row per method; '–' where a figure does not apply."""
    methods = results["methods"]
    win_key = next(
        (k for row in methods.values() for k in row if k.startswith("win_tie_vs_")), None
    )
    header = ["method"] + [c[0] for c in COLUMNS] + ([win_key.replace("_", " ")] if win_key else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, row in methods.items():
        cells = [name] + [_cell(row.get(key), fmt) for _, key, fmt in COLUMNS]
        if win_key:
            win = row.get(win_key)
            cells.append(
                "–"
                if not win
                else f"{win['win_tie_rate']:.2f} ({win['wins']}/{win['ties']}/{win['losses']})"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def breakdown_table(results: dict[str, Any]) -> str:
    """Where the time goes: seconds in each model, and the rest (sampling, Python, HF)."""
    lines = [
        "| method | wall s | target | draft | companion | verifier | other |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in results["methods"].items():
        parts = row["time_breakdown_s"]
        other = row["wall_s"] - sum(parts.values())
        cells = [f"{row['wall_s']:.2f}"] + [
            f"{parts[k]:.2f}" for k in ("target", "draft", "companion", "verifier")
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {other:.2f} |")
    return "\n".join(lines)


def _ratio(methods: dict[str, Any], a: str, b: str) -> float | None:
    if a in methods and b in methods and methods[b]["tokens_per_s"]:
        return methods[a]["tokens_per_s"] / methods[b]["tokens_per_s"]
    return None


def check_targets(results: dict[str, Any], targets: dict[str, float]) -> list[dict[str, Any]]:
    """Each bar of `bench.targets` against this run: measured value, bar, met or not."""
    m = results["methods"]
    measured: dict[str, float | None] = {
        "sd_vs_target_only": _ratio(m, "sd", "target_only"),
        "sd_vs_hf_assisted": _ratio(m, "sd", "hf_assisted"),
        "sprinter_vs_sd": _ratio(m, "sprinter", "sd"),
        "svip_vs_sd": _ratio(m, "svip", "sd"),
        "sprinter_rouge_l_ref_gap": None,
    }
    if "sprinter" in m and "sd" in m and m["sd"].get("rouge_l_ref") is not None:
        measured["sprinter_rouge_l_ref_gap"] = m["sd"]["rouge_l_ref"] - m["sprinter"]["rouge_l_ref"]
    rows = []
    for name, bar in targets.items():
        value = measured.get(name)
        if value is None:
            continue
        met = value <= bar if name.endswith("_gap") else value >= bar
        rows.append({"name": name, "measured": value, "bar": bar, "met": met})
    return rows


def write_results(out: Path, results: dict[str, Any]) -> None:
    write_json(out / "results.json", results)
    prof = results["latency_profile"]
    target_ms = ", ".join(
        f"{n}: {ms:.1f}" for n, ms in sorted(prof["target_ms"].items(), key=lambda kv: int(kv[0]))
    )
    energy = {row.get("energy_note") for row in results["methods"].values()} - {None}
    lines = [
        f"# Bench: {results['experiment']}",
        "",
        f"{results['num_prompts']} prompts, {results['max_new_tokens']} new tokens each, sampling "
        f"{results['sampling']}, on {results['device']} ({results['dtype']}, {results['threads']} threads). "
        f"Models: {results['models']}.",
        f"sd's gamma = {results['sd_gamma']} (the implied-speedup optimum at alpha "
        f"{results['alpha']:.3f}, from {results['alpha_source']}). Latency profile (ms per target forward by new tokens): "
        f"{target_ms}; draft step {prof['draft_ms']:.2f} ms"
        + (f", companion step {prof['companion_ms']:.2f} ms." if prof["companion_ms"] else "."),
        "",
        results_table(results),
        "",
        "`acceptance`: of the drafted tokens the target checked, the share it kept.",
        "`verifier acceptance`: of the drafted tokens, the share committed on a verifier's word",
        "without a target check (sprinter's; its acceptance counts only the target's checks).",
        "",
        "Time breakdown (seconds inside each model's forward; `other` is sampling, Python and, for",
        "the HF peers, everything, since their model time is not separated):",
        "",
        breakdown_table(results),
        "",
    ]
    if results.get("targets"):
        lines += ["Against the bars (`bench.targets`):", ""]
        for row in results["targets"]:
            verdict = "met" if row["met"] else "**NOT met**"
            sign = "<=" if row["name"].endswith("_gap") else ">="
            lines.append(
                f"- {row['name']}: {row['measured']:.2f} (bar {sign} {row['bar']:g}): {verdict}"
            )
        lines.append("")
    if results.get("skipped"):
        lines += ["Skipped: " + "; ".join(f"{k}: {v}" for k, v in results["skipped"].items()), ""]
    if energy:
        lines += ["Energy per token unavailable: " + "; ".join(sorted(energy)), ""]
    if results.get("judge"):
        lines += [
            f"Win-tie judge: {results['judge']} (wins/ties/losses against the baseline, both orders).",
            "",
        ]
    (out / "results.md").write_text("\n".join(lines))


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


def _pareto(points: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Points no other point beats on both speed and quality, by increasing speed."""
    front = [p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points)]
    return sorted(front)
