"""results.md's tables: one row per method at batch 1 and at larger batch sizes, where each
method's time goes, and the latency profile the run used."""

from __future__ import annotations

from typing import Any

from sprinter_train.bench.report.cells import cell

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


TV_COLUMN = ("TV 1st token", "tv_first_token", "{:.4f}")  # methods whose traits: law_computed


BATCH_COLUMNS = [  # batch > 1: speed, calls and acceptance (quality is the batch-1 run's)
    c for c in COLUMNS if c[1] not in ("rouge_l_ref", "target_ppl")
]


UNSUPPORTED = "batch > 1 unsupported"


def results_table(results: dict[str, Any]) -> str:
    """One markdown row per method; '–' where a figure does not apply. The TV column shows
    when a method whose first-token law is computed ran."""
    methods = results["methods"]
    win_key = next(
        (k for row in methods.values() for k in row if k.startswith("win_tie_vs_")), None
    )
    tv = any(TV_COLUMN[1] in row for row in methods.values())
    columns = COLUMNS + ([TV_COLUMN] if tv else [])
    header = ["method"] + [c[0] for c in columns] + ([win_key.replace("_", " ")] if win_key else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, row in methods.items():
        cells = [name] + [cell(row.get(key), fmt) for _, key, fmt in columns]
        if win_key:
            win = row.get(win_key)
            cells.append(
                "–"
                if not win
                else f"{win['win_tie_rate']:.2f} ({win['wins']}/{win['ties']}/{win['losses']})"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def batch_table(batch: dict[str, Any]) -> str:
    """One markdown row per method at a batch size > 1; HF's peers marked unsupported."""
    header = ["method"] + [c[0] for c in BATCH_COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, row in batch["methods"].items():
        cells = [name] + [cell(row.get(key), fmt) for _, key, fmt in BATCH_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    for name in batch.get("unsupported", {}):
        lines.append(f"| {name} | {UNSUPPORTED} |" + " |" * (len(header) - 2))
    return "\n".join(lines)


def breakdown_table(methods: dict[str, Any], profile: dict[str, Any] | None = None) -> str:
    """Where the time goes: seconds in each model (the target's prompt prefills among them),
    the rest (sampling, Python, HF), and one target call's ms with the prefills taken out;
    beneath, target_only's call against the latency profile's 1-token forward (`profile`:
    the profile at this batch size)."""
    lines = [
        "| method | wall s | target | of it prefill | draft | companion | verifier | other "
        "| target ms a call |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in methods.items():
        parts = row["time_breakdown_s"]
        other = row["wall_s"] - sum(parts.values())
        prefill = (row.get("prefill_s") or {}).get("target")
        call = (row.get("cost_ms") or {}).get("target_call")
        cells = [f"{row['wall_s']:.2f}", f"{parts['target']:.2f}", cell(prefill, "{:.2f}")]
        cells += [f"{parts[k]:.2f}" for k in ("draft", "companion", "verifier")]
        cells += [f"{other:.2f}", cell(call, "{:.2f}")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines + target_call_lines(methods, profile))


def target_call_lines(methods: dict[str, Any], profile: dict[str, Any] | None) -> list[str]:
    """target_only's target call (one token a row, prefills apart) over the profile's 1-token
    forward at the same batch size: whether the timed run pays what the profile measured."""
    call = ((methods.get("target_only") or {}).get("cost_ms") or {}).get("target_call")
    ms = ((profile or {}).get("target_ms") or {}).get("1")
    if not call or not ms:
        return []
    return [
        "",
        f"target_only's target call, prefills apart: {call:.2f} ms, {call / ms:.2f}x the "
        f"latency profile's 1-token forward ({ms:.2f} ms).",
    ]


def profile_at(results: dict[str, Any], size: str) -> dict[str, Any] | None:
    """The latency profile at one batch size (None where the run has none there)."""
    return ((results.get("latency_profile") or {}).get("by_batch") or {}).get(size)


def latency_table(profile: dict[str, Any]) -> str:
    """The profile the run used: ms per target forward by tokens a row, and a drafting step,
    at each batch size (batch 1 alone for results written before batch sizes existed)."""
    by_batch = profile.get("by_batch") or {
        "1": {k: profile[k] for k in ("target_ms", "draft_ms", "companion_ms")}
    }
    sizes = sorted({int(n) for per in by_batch.values() for n in per["target_ms"]})
    header = ["batch"] + [f"target {n}" for n in sizes] + ["draft step", "companion step"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for size, per in sorted(by_batch.items(), key=lambda kv: int(kv[0])):
        target = {int(n): ms for n, ms in per["target_ms"].items()}
        cells = [size] + [cell(target.get(n), "{:.2f}") for n in sizes]
        cells += [cell(per["draft_ms"], "{:.2f}"), cell(per["companion_ms"], "{:.2f}")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
