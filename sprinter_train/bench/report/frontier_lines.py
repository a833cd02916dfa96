"""results.md's "Lossy frontier" section (bench/quality/frontier.py's figures): per batch size,
every lossy rule's points (threshold, perplexity ratio, tokens/s, whether on the frontier),
then each rule's fastest timed point within the perplexity bar and the trained verifier's
tokens/s over the best hand rule's, said plainly whichever way it goes; the plot beside it is
report/plots.py's `plot_frontier`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sprinter_train.bench.quality.frontier import HAND, RULES, SYMBOL, on_frontier
from sprinter_train.bench.report.cells import cell

PLOT = "frontier.png"  # beside results.md

RULE_TEXT = {
    "verifier": "sprinter with its trained verifier (methods.sprinter.verifier), over τ",
    "entropy": "sprinter's decoder with exp(−H) of the draft's raw softmax as its score, a "
    "hand rule, over τ",
    "typical": "Medusa's typical acceptance, p(x) > min(ε, δ·exp(−H(p))) with δ = √ε "
    "unless methods.typical.delta sets it, a hand rule, over ε",
}


def point_text(entry: Mapping[str, Any] | None) -> str:
    """A point as a sentence names it: threshold, tokens/s and ratio."""
    if entry is None:
        return "–"
    return (
        f"{SYMBOL[entry['rule']]} {entry['threshold']:g}, "
        f"{cell(entry['tokens_per_s'], '{:.1f}')} tokens/s at ratio "
        f"{cell(entry['ppl_ratio'], '{:.3f}')}"
    )


def rule_reading(
    rule: str, found: Mapping[str, Any] | None, entries: list[dict[str, Any]], absent: Mapping
) -> str:
    """One rule's fastest point within the bar, or why it has none."""
    if found is not None:
        return f"{rule}: {point_text(found)}"
    if rule in absent:
        return f"{rule}: not traced ({absent[rule]})"
    ratios = [e["ppl_ratio"] for e in entries if e["rule"] == rule and e["ppl_ratio"] is not None]
    least = f", its least ratio {min(ratios):.3f}" if ratios else ""
    return f"{rule}: no timed point within the bar{least}"


def verdict_lines(
    size: int, reading: Mapping[str, Any], entries: list, absent: Mapping
) -> list[str]:
    """The batch size's sentence: each rule's fastest point within the bar, and the trained
    verifier's against the best hand rule's."""
    fastest = reading["fastest"]
    rules = "; ".join(rule_reading(r, fastest[r], entries, absent) for r in RULES)
    head = (
        f"Fastest timed point within the perplexity bar (ratio ≤ {reading['bar']:g}, "
        f"bench.guard.ppl_ratio) at batch {size}: {rules}."
    )
    best = reading["best_hand"]
    if reading["verifier_vs_hand"] is not None:
        met = "met" if reading["met"] else "**NOT met**"
        tail = (
            f"The trained verifier's fastest point is {reading['verifier_vs_hand']:.2f}× the best "
            f"hand rule's ({best}, {point_text(fastest[best])}) at batch {size} (bar ≥ "
            f"{reading['least']:g}×, bench.frontier.verifier_vs_hand): {met}."
        )
        if not reading["met"]:
            tail += (
                " At this loss of quality the trained verifier does not buy that much speed "
                "over a hand rule."
            )
    elif fastest["verifier"] is None:
        tail = (
            f"No ratio of the trained verifier to a hand rule at batch {size}: the verifier "
            "rule has no timed point within the bar"
            + ("." if best is None else f", while {best} has one ({point_text(fastest[best])}).")
        )
    else:
        hand = " and ".join(h for h in HAND)
        tail = (
            f"No ratio of the trained verifier to a hand rule at batch {size}: neither {hand} "
            "has a timed point within the bar, while the verifier has one "
            f"({point_text(fastest['verifier'])})."
        )
    return [head, "", tail, ""]


def frontier_section(results: Mapping[str, Any]) -> list[str]:
    """results.md's "Lossy frontier" section; nothing when the frontier did not run."""
    entries, summary = results.get("frontier"), results.get("frontier_summary")
    if entries is None or not summary:
        return []
    timing = summary["timing"]
    lines = [
        "## Lossy frontier",
        "",
        "Each lossy rule decoded untimed at every threshold of bench.frontier on the batch-1 "
        "run's prompts and seeds; `ppl ratio` is the target's perplexity of its output over "
        f"target_only's {cell(summary['target_only_ppl'], '{:.2f}')} "
        f"({summary['target_only_ppl_from']}). Rules: "
        + "; ".join(f"`{rule}`, {RULE_TEXT[rule]}" for rule in RULES)
        + ". Stricter is higher for all three. `tokens/s` is timed as the methods above are "
        f"(bench.warmup_runs {timing['warmup_runs']}, bench.min_timed_runs "
        f"{timing['min_timed_runs']}, the points interleaved per group) at the points on the "
        "frontier by the untimed pass's own speed and at each rule's fastest within the bar "
        "by it; – where not timed. `on frontier`: no other timed point is at least as fast "
        "with at most its ratio.",
        "",
    ]
    absent = summary.get("absent") or {}
    for size in summary["batches"]:
        own = [e for e in entries if e["batch"] == size]
        lines += [
            f"### Batch size {size}",
            "",
            "| rule | threshold | ppl ratio | tokens/s | on frontier |",
            "|---|---|---|---|---|",
        ]
        for entry, on in zip(own, on_frontier(own), strict=True):
            lines.append(
                f"| {entry['rule']} | {SYMBOL[entry['rule']]} {entry['threshold']:g} | "
                f"{cell(entry['ppl_ratio'], '{:.3f}')} | {cell(entry['tokens_per_s'], '{:.1f}')} | "
                f"{'**yes**' if on else 'no'} |"
            )
        lines.append("")
        lines += verdict_lines(size, summary["verdicts"][str(size)], own, absent)
    if summary.get("batches_not_run"):
        lines += [
            f"bench.frontier.batches {summary['batches_not_run']} left out: not among the batch "
            "sizes this run decoded.",
            "",
        ]
    if entries:
        lines += [f"![lossy frontier]({PLOT})", ""]
    return lines
