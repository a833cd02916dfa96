"""The bench's results.json and results.md (`write_results`): the page put together from
its header, tables, verdicts, timing and learned-method lines, with the law-distance line
and the sections per batch size > 1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sprinter_train.bench.quality.guard import guard_section, guard_warnings
from sprinter_train.bench.report.frontier_lines import frontier_section
from sprinter_train.bench.report.header_lines import (
    companion_plan_lines,
    gamma_line,
    overlap_warning,
    planner_lines,
    profile_line,
    profile_warning,
    title,
)
from sprinter_train.bench.report.learned_lines import learned_sections
from sprinter_train.bench.report.oracle import oracle_section
from sprinter_train.bench.report.tables import (
    batch_table,
    breakdown_table,
    latency_table,
    profile_at,
    results_table,
)
from sprinter_train.bench.report.timing_lines import compile_line, warmup_lines
from sprinter_train.bench.report.verdicts import traits_in
from sprinter_train.bench.report.vllm_lines import vllm_section
from sprinter_train.bench.run.provenance import load_warning
from sprinter_train.core.io import write_json


def law_distance_lines(results: dict[str, Any]) -> list[str]:
    """A lossy method's loss (and a lossless one's zero, the check) as the first token's TV
    from the target, for every method whose traits say its law is computed."""
    tv = {
        n: row["tv_first_token"] for n, row in results["methods"].items() if "tv_first_token" in row
    }
    if not tv:
        return []
    traits = traits_in(results)
    lossy = {n for n in tv if (traits.get(n) or {}).get("lossless") is False}
    parts = [
        f"{name} {value:.4f}" + (" (lossy: the published rule)" if name in lossy else "")
        for name, value in tv.items()
    ]
    exact = [n for n in tv if n not in lossy]
    closing = (
        f"{_joined(exact)} decide before the draw, so their distance is 0 up to rounding."
        if len(exact) > 1
        else f"{exact[0]} decides before the draw, so its distance is 0 up to rounding."
        if exact
        else ""
    )
    return [
        "Distance from the target's law (`TV 1st token`): total variation between the first "
        "generated token's law under the method's rule and the target's p, computed exactly "
        f"(enumerating the vocabulary at batch size 1), mean over "
        f"{results.get('law_distance_prompts', '?')} prompts: " + "; ".join(parts) + ". " + closing,
        "",
    ]


def batch_sections(results: dict[str, Any]) -> list[str]:
    """One table and time breakdown per batch size > 1, then the goodput plot."""
    batches = results.get("batches") or {}
    lines: list[str] = []
    for size, batch in sorted(batches.items(), key=lambda kv: int(kv[0])):
        if size == "1":
            continue
        lines += [
            f"## Batch size {size}",
            "",
            f"{batch['groups']} groups of up to {size} consecutive prompts, decoded as one batch "
            f"(rows leave as they finish); sd's gamma = {batch['sd_gamma']}. Speedups are over "
            "target_only at this batch size; ROUGE-L vs target is against its output here.",
            "",
            batch_table(batch),
            "",
            "A batched forward counts as one target call, so tokens per target call grows with "
            "the batch. Time breakdown (`other`: wall minus the models' forwards: sampling and "
            "Python):",
            "",
            breakdown_table(batch["methods"], profile_at(results, size)),
            "",
        ]
    if len(batches) > 1:
        lines += ["## Goodput against batch size", "", "![goodput](goodput_vs_batch.png)", ""]
    return lines + warmup_lines(results)


def _joined(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def write_results(out: Path, results: dict[str, Any]) -> None:
    write_json(out / "results.json", results)
    energy = {row.get("energy_note") for row in results["methods"].values()} - {None}
    sizes = results.get("batch_sizes", [1])
    warning = load_warning(results.get("provenance") or {})
    unchecked = profile_warning(results)
    overlap = overlap_warning(results)
    lines = [
        title(results),
        "",
        *([warning, ""] if warning else []),
        *([unchecked, ""] if unchecked else []),
        *([overlap, ""] if overlap else []),
        *guard_warnings(results),
        f"{results['num_prompts']} prompts, {results['max_new_tokens']} new tokens each, sampling "
        f"{results['sampling']}, on {results['device']} ({results['dtype']}, {results['threads']} threads), "
        f"batch sizes {sizes}. Models: {results['models']}.",
        gamma_line(results),
        "",
        *planner_lines(results),
        *companion_plan_lines(results),
        profile_line(results),
        *([compiled] if (compiled := compile_line(results)) else []),
        "",
        latency_table(results["latency_profile"]),
        "",
        "## Batch size 1",
        "",
        results_table(results),
        "",
        "`acceptance`: of the drafted tokens the target checked, the share it kept.",
        "`verifier acceptance`: of the drafted tokens, the share committed on a verifier's word",
        "without a target check (sprinter's; its acceptance counts only the target's checks).",
        "",
        *law_distance_lines(results),
        "Time breakdown (seconds inside each model's forward; `other` is sampling, Python and, for",
        "the HF peers, everything, since their model time is not separated):",
        "",
        breakdown_table(results["methods"], profile_at(results, "1")),
        "",
    ]
    if results.get("targets"):
        lines += ["Against the bars (`bench.targets`, batch 1):", ""]
        for row in results["targets"]:
            verdict = "met" if row["met"] else "**NOT met**"
            sign = "<=" if row["name"].endswith("_gap") else ">="
            against = f", over {row['against']}" if row.get("against") else ""
            lines.append(
                f"- {row['name']}: {row['measured']:.2f} (bar {sign} {row['bar']:g}{against}): "
                f"{verdict}"
            )
        lines.append("")
    lines += guard_section(results)
    lines += frontier_section(results)
    lines += learned_sections(results)
    lines += oracle_section(results)
    lines += vllm_section(results)
    if results.get("skipped"):
        lines += ["Skipped: " + "; ".join(f"{k}: {v}" for k, v in results["skipped"].items()), ""]
    if energy:
        lines += ["Energy per token unavailable: " + "; ".join(sorted(energy)), ""]
    if results.get("judge"):
        lines += [
            f"Win-tie judge: {results['judge']} (wins/ties/losses against the baseline, both orders).",
            "",
        ]
    lines += batch_sections(results)
    (out / "results.md").write_text("\n".join(lines))
