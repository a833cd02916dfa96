"""The bench's outputs: results.json, results.md (the table people read) and plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sprinter_train.bench.quality.guard import guard_section, guard_warnings
from sprinter_train.bench.report.cells import cell
from sprinter_train.bench.report.oracle import oracle_section
from sprinter_train.bench.run.provenance import load_warning
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
TV_COLUMN = ("TV 1st token", "tv_first_token", "{:.4f}")  # methods whose traits: law_computed
BATCH_COLUMNS = [  # batch > 1: speed, calls and acceptance (quality is the batch-1 run's)
    c for c in COLUMNS if c[1] not in ("rouge_l_ref", "target_ppl")
]
UNSUPPORTED = "batch > 1 unsupported"
VS_BEST = "_vs_best_lossless"  # a bar's suffix: `<method>_vs_best_lossless`
GAP = "_rouge_l_ref_gap"  # a bar's suffix: `<method>_rouge_l_ref_gap`


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


def warmup_lines(results: dict[str, Any]) -> list[str]:
    """Seconds each method's untimed warm-up took per batch size (compilation and CUDA-graph
    capture land here, never in tokens/s), hf_static's compile before its warm-up, and the
    set-up phases (`phase_lines`)."""
    batches = results.get("batches") or {}
    sizes = sorted((s for s in batches if batches[s].get("warmup_s")), key=int)
    phases = results.get("setup_phases") or []
    if not sizes:
        return ["## Warm-up (untimed)", "", *phase_lines(phases, results)] if phases else []
    names = dict.fromkeys(n for s in sizes for n in batches[s]["warmup_s"])
    lines = [
        "## Warm-up (untimed)",
        "",
        "Seconds of each method's warm-up runs (`bench.warmup_runs`) per batch size: compile",
        "time lands here, never in tokens/s.",
        "",
        "| method | " + " | ".join(f"batch {s}" for s in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for name in names:
        cells = [cell(batches[s]["warmup_s"].get(name), "{:.2f}") for s in sizes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    compile_s = (results.get("settings") or {}).get("hf_static", {}).get("compile_s")
    if compile_s is not None:
        lines += ["", f"hf_static compiled its decode step in {compile_s:.1f} s before that."]
    return [*lines, "", *phase_lines(phases, results)]


PHASE_SUMS = ("seconds", "compile_s", "graphs", "cache_hits", "cache_misses")


def phase_rows(phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The set-up phases (`bench.phases`) as the table lists them: one by one, the methods'
    warm-ups summed per batch size (each method's own seconds are in the table above)."""
    rows: list[dict[str, Any]] = []
    by_size: dict[Any, dict[str, Any]] = {}
    for record in phases:
        if record.get("method") is None:
            rows.append(record)
            continue
        size = record.get("batch_size")
        if size not in by_size:
            by_size[size] = {"phase": f"warm-ups at batch {size}"}
            rows.append(by_size[size])
        for key in PHASE_SUMS:
            by_size[size][key] = by_size[size].get(key, 0) + record.get(key, 0)
    return rows


def phase_lines(phases: list[dict[str, Any]], results: dict[str, Any] | None = None) -> list[str]:
    """How long each untimed set-up phase took and what it compiled (graphs dynamo compiled;
    look-ups the on-disk compile cache served), the warm-ups that compiled graphs, and what
    the run compiled after them (`after_setup_line`)."""
    if not phases:
        return []
    lines = [
        "Set-up phases (compiling: the runners' compiles and captures; hf_static's: dynamo's "
        "own tally):",
        "",
        "| phase | seconds | compiling (s) | graphs compiled | from the compile cache |",
        "|---|---|---|---|---|",
    ]
    for row in phase_rows(phases):
        lookups = row.get("cache_hits", 0) + row.get("cache_misses", 0)
        cached = f"{row.get('cache_hits', 0)} of {lookups}" if lookups else "–"
        lines.append(
            f"| {row['phase']} | {cell(row.get('seconds'), '{:.2f}')} | "
            f"{cell(row.get('compile_s'), '{:.2f}')} | {row.get('graphs', 0)} | {cached} |"
        )
    compiled = [
        f"{r['method']} at batch {r.get('batch_size')} ({r['graphs']})"
        for r in phases
        if r.get("method") is not None and r.get("graphs")
    ]
    if compiled:
        lines += ["", "Warm-ups that compiled graphs: " + ", ".join(compiled) + "."]
    if after := after_setup_line(phases, results or {}):
        lines += ["", after]
    return [*lines, ""]


def after_setup_line(phases: list[dict[str, Any]], results: dict[str, Any]) -> str | None:
    """What the run compiled beyond its set-up phases, in compile-cache look-ups (the run's
    record less theirs: process-wide counts, so the phases' add up): shapes the timed runs
    met that no warm-up reached. Left out of tokens/s like the rest, but a run that should
    compile only in its set-up shows it here. None when there were none."""
    record = (results.get("provenance") or {}).get("compile") or {}
    keys = ("cache_hits", "cache_misses")
    lookups = sum(record.get(k, 0) for k in keys)
    lookups -= sum(r.get(k, 0) for r in phases for k in keys)
    if lookups <= 0:
        return None
    return (
        f"After the set-up, the timed runs compiled more: {lookups} compile-cache look-ups "
        "for shapes no warm-up reached (their time left out of tokens/s too)."
    )


def compile_line(results: dict[str, Any]) -> str | None:
    """What the run compiled and how much of it the on-disk compile cache served
    (`decoding.compile_cache`), None for a run that compiled nothing."""
    record = (results.get("provenance") or {}).get("compile") or {}
    lookups = record.get("cache_hits", 0) + record.get("cache_misses", 0)
    if not lookups and not record.get("seconds"):
        return None
    folder = record.get("cache_folder") or "none (decoding.compile_cache=null)"
    verdict = "a cache hit" if record.get("cache_hit") else "compiled anew in part or whole"
    return (
        f"Compiling the forwards took {record.get('seconds', 0.0):.1f} s (outside tokens/s): "
        f"{record.get('cache_hits', 0)} of {lookups} graphs came from the compile cache "
        f"({verdict}; folder {folder})."
    )


def _ratio(methods: dict[str, Any], a: str, b: str) -> float | None:
    if a in methods and b in methods and methods[b]["tokens_per_s"]:
        return methods[a]["tokens_per_s"] / methods[b]["tokens_per_s"]
    return None


def _joined(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def traits_in(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each method's traits as this run recorded them (results.json: `traits`)."""
    return results.get("traits") or {}


def rivals_of(results: dict[str, Any], name: str) -> tuple[str, ...]:
    """The methods `name` is meant to beat, as its traits declared them in this run."""
    return tuple((traits_in(results).get(name) or {}).get("rivals") or ())


def learned_length(traits: dict[str, Any]) -> bool:
    """A lossless method that reads a trained verifier and names rivals (sd_learned's
    traits): the report sets it against its best rival with what its predictor cost."""
    needs = traits.get("needs") or ()
    return bool(traits.get("lossless") and "verifier" in needs and traits.get("rivals"))


def learned_methods(results: dict[str, Any]) -> list[str]:
    """The methods of this run whose traits make them `learned_length`."""
    return [name for name, traits in traits_in(results).items() if learned_length(traits)]


def best_rival(methods: dict[str, Any], rivals: tuple[str, ...]) -> str | None:
    """The fastest of `rivals` that ran (tokens/s), None when none did."""
    ran = [n for n in rivals if (methods.get(n) or {}).get("tokens_per_s")]
    return max(ran, key=lambda n: methods[n]["tokens_per_s"]) if ran else None


def vs_best(methods: dict[str, Any], name: str, rivals: tuple[str, ...]) -> float | None:
    """`name`'s tokens/s over the fastest of its rivals."""
    best = best_rival(methods, rivals)
    return None if best is None else _ratio(methods, name, best)


def bars_measured(results: dict[str, Any]) -> tuple[dict[str, float | None], dict[str, str]]:
    """Every bar this run can be held to, named from the methods' traits, and the rival each
    `<method>_vs_best_lossless` bar was measured over. Per method: `<method>_vs_<rival>` for
    each rival it declares and each HF peer that ran (a method without traits);
    `<method>_vs_best_lossless` when it is a `learned_length`; `<method>_rouge_l_ref_gap`
    (its first rival's ROUGE-L against a reference less its own) when it is lossy."""
    m, traits = results["methods"], traits_in(results)
    peers = [n for n in m if n not in traits]
    measured: dict[str, float | None] = {}
    against: dict[str, str] = {}
    for name, declared in traits.items():
        rivals = tuple(declared.get("rivals") or ())
        for other in (*rivals, *peers):
            measured[f"{name}_vs_{other}"] = _ratio(m, name, other)
        if learned_length(declared):
            measured[name + VS_BEST] = vs_best(m, name, rivals)
            best = best_rival(m, rivals)
            if best is not None:
                against[name + VS_BEST] = best
        if declared.get("lossless") is False and rivals and name in m and rivals[0] in m:
            ref, own = m[rivals[0]].get("rouge_l_ref"), m[name].get("rouge_l_ref")
            if ref is not None and own is not None:
                measured[name + GAP] = ref - own
    return measured, against


def check_targets(results: dict[str, Any], targets: dict[str, float]) -> list[dict[str, Any]]:
    """Each bar of `bench.targets` against this run: measured value, bar, met or not."""
    measured, against = bars_measured(results)
    rows = []
    for name, bar in targets.items():
        value = measured.get(name)
        if value is None:
            continue
        met = value <= bar if name.endswith("_gap") else value >= bar
        row = {"name": name, "measured": value, "bar": bar, "met": met}
        if name in against:
            row["against"] = against[name]
        rows.append(row)
    return rows


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
    lines += ["", verifier_line(settings), ""] if settings else [""]
    return lines


def planner_lines(results: dict[str, Any]) -> list[str]:
    """How sd's planner chose its gamma round by round, when sd ran with one."""
    planner = ((results.get("settings") or {}).get("sd") or {}).get("planner")
    if not planner:
        return []

    def by_number(items: Any) -> list[tuple[str, Any]]:
        # keys are "3" or "3 (probe)" (a round that re-timed a rival gamma)
        return sorted(items, key=lambda kv: (int(kv[0].split()[0]), kv[0]))

    rounds = "; ".join(
        f"rows {rows}: " + ", ".join(f"gamma {g} × {n}" for g, n in by_number(per.items()))
        for rows, per in by_number(planner["rounds_by_rows_and_gamma"].items())
    )
    prior = planner.get("prior_alpha")
    return [
        "sd's gamma is where it starts at each batch size: before every round it is chosen "
        "again from the run's own target and draft forward times and the acceptance so far "
        f"(prior alpha {cell(prior, '{:.3f}')}, switching only for {planner['margin']:.0%} "
        "more estimated goodput; 0 is a target-only round; a probe plays the best other gamma "
        "once every few rounds to time it again). Rounds by live rows and gamma "
        f"(every batch size, warm-up included): {rounds or 'none'}.",
        "",
    ]


def companion_plan_lines(results: dict[str, Any]) -> list[str]:
    """How often sv read its companion, and the goodput it measured either way, when sv ran
    with a companion plan."""
    plan = ((results.get("settings") or {}).get("sv") or {}).get("companion_plan")
    if not plan or not plan.get("rounds_by_rows_and_mode"):
        return []
    per_rows = []
    bands = sorted(
        plan["rounds_by_rows_and_mode"].items(), key=lambda kv: int(kv[0].split("-")[-1])
    )
    for rows, tally in bands:
        rates = plan.get("speed_by_rows_and_mode", {}).get(rows, {})
        played = ", ".join(f"{mode} × {n}" for mode, n in sorted(tally.items()))
        measured = ", ".join(f"{mode} {rate:.2f}" for mode, rate in sorted(rates.items()))
        per_rows.append(f"rows {rows}: {played}" + (f" (speed {measured})" if measured else ""))
    total = sum(sum(t.values()) for t in plan["rounds_by_rows_and_mode"].values())
    read = sum(
        n
        for tally in plan["rounds_by_rows_and_mode"].values()
        for mode, n in tally.items()
        if mode.startswith("companion")
    )
    return [
        f"sv read its companion in {read} of {total} rounds: before every round it plays the "
        "mode (`companion`: SV's scheduler over the table; `prior`: sd's gamma at the measured "
        "acceptance, no companion forward; `target`: no draft) whose measured speed (tokens a "
        "row per one-token target forward's time) in this band of live rows is highest, "
        f"switching for {plan['margin']:.0%} more, after "
        f"{plan['warmup']} rounds of each, probing another every {plan['probe_every']} rounds "
        "(sprinter_train/decoding/policies/plans/companion_plan.py). By live rows (every batch size, warm-up "
        f"included): {'; '.join(per_rows)}.",
        "",
    ]


def profile_warning(results: dict[str, Any]) -> str | None:
    """The results.md warning for a latency profile that disagreed with the run's forwards."""
    check = (results.get("latency_profile") or {}).get("check") or {}
    if check.get("agrees", True):
        return None
    ratio = check.get("ratio")
    history = (results.get("latency_profile") or {}).get("history")
    done = "; then ".join(history) if history else "after measuring it again"
    return (
        f"**Warning:** the latency profile could not be made to agree with this run's own "
        f"target forwards (they took {'?' if ratio is None else f'{ratio:.2f}'}x the profile's "
        f"times, limit {check.get('limit')}x; {done}): sd's gamma was not "
        "chosen from it (bench.latency.unchecked_gamma), and its timings are not to be trusted."
    )


def profile_line(results: dict[str, Any]) -> str:
    """The latency table's heading, with what this run did for its profile (reused from
    bench/latency.json, measured, measured again) as results.json records it."""
    history = (results.get("latency_profile") or {}).get("history")
    how = f"; {'; then '.join(history)}" if history else ""
    return f"Latency profile (ms per forward; target by new tokens a row{how}):"


def title(results: dict[str, Any]) -> str:
    """results.md's first line: a partial run (stopped after some batch sizes) says so there,
    with the batch sizes it measured, so it never reads as a complete run at those sizes."""
    partial = results.get("partial")
    if not partial:
        return f"# Bench: {results['experiment']}"
    return (
        f"# PARTIAL bench: {results['experiment']}: the run stopped after batch sizes "
        f"{partial['batch_sizes_done']} of {partial['batch_sizes']}"
    )


def gamma_line(results: dict[str, Any]) -> str:
    """What sd's gamma was and how it was chosen, as the run recorded it (`sd_gamma_source`):
    a fixed or unchecked gamma is not called the implied-speedup optimum."""
    source = results.get("sd_gamma_source") or "the implied-speedup optimum"
    priced = "on the latency profile at that batch size" if "optimum" in source else ""
    return (
        f"sd's gamma = {results['sd_gamma']} at batch 1 ({source}; alpha "
        f"{results['alpha']:.3f}, from {results['alpha_source']}{', ' if priced else ''}"
        f"{priced})."
    )


def overlap_warning(results: dict[str, Any]) -> str | None:
    """The results.md warning for a bench run with bench.allow_train_overlap on prompts its
    verifiers or SV table were fitted on (results.json: settings.<method>.<entry>.train_overlap)."""
    found = [
        f"{name}'s {key} ({entry['train_overlap']})"
        for name, settings in (results.get("settings") or {}).items()
        for key, entry in settings.items()
        if isinstance(entry, dict) and entry.get("train_overlap")
    ]
    if not found:
        return None
    return (
        f"**Warning:** bench.allow_train_overlap: prompts the predictors were fitted on were "
        f"timed (overlapping prompts: {', '.join(found)}); their speed is not that of new prompts."
    )


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
    lines += learned_sections(results)
    lines += oracle_section(results)
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


def _pareto(points: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Points no other point beats on both speed and quality, by increasing speed."""
    front = [p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points)]
    return sorted(front)
