"""results.md's lines on untimed work: each method's warm-up, the set-up phases and what
they compiled, and what the run compiled after them or from the compile cache."""

from __future__ import annotations

from typing import Any

from sprinter_train.bench.report.cells import cell


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
