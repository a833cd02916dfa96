"""results.md's opening lines: the title (a partial run says so), the warnings on the
latency profile and on timed training prompts, how sd's gamma was chosen, sd's planner and
sv's companion plan, and the latency table's heading."""

from __future__ import annotations

from typing import Any

from sprinter_train.bench.report.cells import cell


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
