"""results.md's section for each learned length: its speed against its fastest rival at
every batch size, what its predictor cost and how its chosen lengths compare with the oracle's."""

from __future__ import annotations

from typing import Any

from sprinter_train.bench.report.cells import cell
from sprinter_train.bench.report.verdicts import (
    VS_BEST,
    best_rival,
    learned_methods,
    rivals_of,
    vs_best,
)

LEARNED_COLUMNS = [  # (header, where in a method's row, format)
    ("verifier ms / draft", ("cost_ms", "verifier_per_draft"), "{:.3f}"),
    ("companion ms / draft", ("cost_ms", "companion_per_draft"), "{:.3f}"),
    ("draft ms / draft", ("cost_ms", "draft_per_draft"), "{:.3f}"),
    ("draft step ms", ("cost_ms", "draft_step"), "{:.3f}"),
    ("drafts / round", ("draft_runs", "drafted_per_round"), "{:.2f}"),
    ("accepted / round", ("draft_runs", "accepted_per_round"), "{:.2f}"),
    ("no-draft rounds", ("draft_runs", "no_draft_share"), "{:.2f}"),
    ("all-accepted rounds", ("draft_runs", "all_accepted_share"), "{:.2f}"),
    ("chosen − oracle", ("draft_runs", "oracle_gap"), "{:.2f}"),
]


def learned_row(
    name: str, size: str, methods: dict[str, Any], bar: float | None, rivals: tuple[str, ...]
) -> str:
    """One batch size's row of a learned length's table."""
    row, best = methods[name], best_rival(methods, rivals)
    ratio = vs_best(methods, name, rivals)
    short = ratio is not None and bar is not None and ratio < bar
    parts = row.get("time_breakdown_s") or {}
    predictor = parts.get("verifier", 0.0) + parts.get("companion", 0.0)
    free = None  # tokens/s had the verifier and companion cost nothing, over the best's
    if best is not None and row["wall_s"] > predictor:
        free = row["tokens"] / (row["wall_s"] - predictor) / methods[best]["tokens_per_s"]
    cells = [
        size,
        cell(row["tokens_per_s"], "{:.1f}"),
        "–" if best is None else f"{best} {methods[best]['tokens_per_s']:.1f}",
        ("**" + cell(ratio, "{:.2f}") + "**") if short else cell(ratio, "{:.2f}"),
        cell(free, "{:.2f}"),
    ]
    cells += [cell((row.get(a) or {}).get(b), fmt) for _, (a, b), fmt in LEARNED_COLUMNS]
    return "| " + " | ".join(cells) + " |"


def verifier_line(settings: dict[str, Any]) -> str:
    """A learned length's predictor as the run loaded it: the verifier's calibration and
    prior."""
    verifier = settings.get("verifier") or {}
    calibration = verifier.get("calibration")
    if calibration:
        fit = (
            f"temperature {calibration['temperature']:.3f} fitted on "
            f"{calibration.get('fitted_on', '?')} ({calibration.get('rows', '?')} rows), NLL "
            f"{cell(calibration.get('nll_before'), '{:.4f}')} before, "
            f"{cell(calibration.get('nll_after'), '{:.4f}')} after"
            + (f" (**warning**: {calibration['warning']})" if calibration.get("warning") else "")
        )
    else:
        fit = "uncalibrated (a sidecar without calibration: T = 1)"
    prior = verifier.get("prior")
    prior_text = (
        f"prior {prior:.3f} (the train split's mean label: a draft's P(accept) before any forward)"
        if prior is not None
        else "no prior in its sidecar (rounds are skipped only where a sure draft would not pay)"
    )
    table = (settings.get("table") or {}).get("path")
    return (
        f"Its verifier `{verifier.get('path', '?')}` (label {verifier.get('label', 'ratio')}): "
        f"{fit}; {prior_text}; SV table: {table or 'none'}."
    )


def learned_sections(results: dict[str, Any]) -> list[str]:
    """One `learned_section` per method whose traits make it a `learned_length`."""
    return [line for name in learned_methods(results) for line in learned_section(results, name)]


def learned_section(results: dict[str, Any], name: str) -> list[str]:
    """A learned length (`name`) against the fastest of its rivals at every batch size, and
    the numbers that say why: what its predictor cost, how calibrated it is, and how far its
    chosen lengths were from the oracle's on the same rounds. Nothing when it did not run."""
    batches = results.get("batches") or {"1": {"methods": results["methods"]}}
    sizes = sorted((s for s, b in batches.items() if name in b["methods"]), key=int)
    if not sizes:
        return []
    targets = results.get("targets") or []
    bar = next((t["bar"] for t in targets if t["name"] == name + VS_BEST), None)
    rivals = rivals_of(results, name)
    header = ["batch", f"{name} tokens/s", "best rival tokens/s", "× best"]
    header += ["× best, predictor free"] + [c[0] for c in LEARNED_COLUMNS]
    lines = [
        f"## {name} against its best rival",
        "",
        f"At each batch size, {name}'s tokens/s over the fastest of {', '.join(rivals)}"
        + (f" (bar {bar:g}; below it in bold)" if bar is not None else "")
        + ", and why: `× best, predictor free` is the ratio had its verifier and companion "
        "cost nothing (their forwards' time taken off its wall time); per drafted token, the "
        "verifier's and the companion's ms (on CUDA the verifier's launches only) beside the "
        "draft's, and one drafting step's ms; per row and round, the drafts it chose and the "
        "target kept, the share of rounds it drafted nothing, the share of drafting rounds "
        "whose every draft was kept (there the oracle length, drafting exactly what the "
        "target keeps, was at least the chosen one) and, over rounds with a rejection, the mean "
        "chosen − oracle length (drafted − kept).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += [learned_row(name, size, batches[size]["methods"], bar, rivals) for size in sizes]
    settings = (results.get("settings") or {}).get(name)
    lines += ["", verifier_line(settings), stop_rule_line(settings), ""] if settings else [""]
    return lines


def stop_rule_line(settings: dict[str, Any]) -> str:
    """The stop rule the bench chose at each batch size (bench/run/stop_choice.py), with the
    modelled tokens/s of the choice, of goodput and of target-only rounds, or why none was
    chosen."""
    rule = settings.get("stop_rule")
    if not isinstance(rule, dict):
        return "Its stop rule: goodput at every batch size (stop_rule not auto)."
    if "by_batch" not in rule:
        return f"Its stop rule: {rule.get('rule', 'goodput')} ({rule.get('why', '')})."
    parts = []
    for size, choice in sorted(rule["by_batch"].items(), key=lambda kv: int(kv[0])):
        rates = choice["candidates"]
        name = choice["rule"] + (
            "" if choice["threshold"] is None else f" < {choice['threshold']:g}"
        )
        parts.append(
            f"batch {size}: **{name}** ({choice['modelled_tokens_per_s']:.1f} modelled tokens/s; "
            f"goodput {rates['goodput']:.1f}, none {rates['none']:.1f})"
        )
    again = rule.get("rechosen_every") or 0
    return (
        f"Its stop rule, chosen on {rule['chosen_on']} ({rule['round_starts']} round starts) by "
        "the round model at this run's latency profile: "
        + "; ".join(parts)
        + "."
        + (f" Chosen again every {again} rounds at the engine's running timings." if again else "")
        + rules_run(rule.get("rounds_by_rows_and_rule") or {})
    )


def rules_run(rounds: dict[str, dict[str, int]]) -> str:
    """The rules the run's rounds went by, by live rows (warm-ups included): what it did,
    where a re-choice at running timings replaced the choice above."""
    if not rounds:
        return ""
    parts = [
        f"rows {rows}: " + ", ".join(f"{rule} × {n}" for rule, n in tally.items())
        for rows, tally in sorted(rounds.items(), key=lambda kv: int(kv[0]))
    ]
    return " Rounds by live rows and the rule they ran by: " + "; ".join(parts) + "."
