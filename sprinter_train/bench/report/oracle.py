"""How much of the oracle's gain each length policy takes.

The oracle (decoding/policies/oracle.py) chooses, each round, the better at the run's own cost
model of a target-only step and each row drafting exactly what the target keeps plus the draft
it rejects (a round that does not draft hands the rows those blocks a token a round, so the
law stays the target's): no lossless length predictor at this pair, cost, gamma_max and batch
size buys more, and since drafting nothing is one of its choices it is never below target_only
but by the clock's noise, so its gain over target_only, and each share of it, is defined at
every batch size, including those where drafting does not pay. A lossless method's share of
the gain is (its tokens/s - target_only's) / (the oracle's - target_only's), and over sd the
same with sd's tokens/s as the floor: 1 is the oracle, 0 no gain (over sd: sd's own length),
below 0 a loss. Where a floor matched or beat the oracle (the clock's noise) there is no gain
to share and the share is None. Lossy methods are not length policies (they change what is
emitted) and get no share.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sprinter_train.bench.report.cells import cell

ORACLE = "oracle"
FLOORS = (("of_gain", "target_only"), ("of_gain_over_sd", "sd"))  # share key -> its floor


def oracle_shares(
    methods: dict[str, dict[str, Any]], lossless: Collection[str]
) -> dict[str, dict[str, float | None]]:
    """Per lossless method but target_only and the oracle: its shares of the oracle's gain
    over each floor (None where the floor did not run or the oracle did not beat it: by the
    clock's noise, since drafting nothing is one of the oracle's choices). Empty when the
    oracle or target_only did not run."""
    tps = {n: row.get("tokens_per_s") for n, row in methods.items()}
    if not tps.get(ORACLE) or not tps.get("target_only"):
        return {}
    top = tps[ORACLE]
    shares: dict[str, dict[str, float | None]] = {}
    for name, value in tps.items():
        if name in (ORACLE, "target_only") or name not in lossless or not value:
            continue
        shares[name] = {}
        for key, floor in FLOORS:
            base = tps.get(floor)
            gain = None if not base else top - base
            shares[name][key] = (value - base) / gain if base and gain and gain > 0 else None
    return shares


def add_oracle_shares(results: dict[str, Any], lossless: Collection[str]) -> None:
    """`oracle_share` in every method row of the batch-1 run and of each batch size."""
    tables = [results["methods"]] + [b["methods"] for b in (results.get("batches") or {}).values()]
    for methods in tables:
        for name, share in oracle_shares(methods, lossless).items():
            methods[name]["oracle_share"] = share


def oracle_table(methods: dict[str, dict[str, Any]]) -> list[str]:
    """One row per method with a share, best share first."""
    shared = [(n, row) for n, row in methods.items() if row.get("oracle_share")]
    shared.sort(key=lambda item: -(item[1]["oracle_share"].get("of_gain") or float("-inf")))
    lines = [
        "| method | tokens/s | share of oracle gain | share over sd | tokens / target call "
        "| drafts / round |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in shared:
        share, runs = row["oracle_share"], row.get("draft_runs") or {}
        cells = [
            name,
            cell(row.get("tokens_per_s"), "{:.1f}"),
            cell(share.get("of_gain"), "{:.2f}"),
            cell(share.get("of_gain_over_sd"), "{:.2f}"),
            cell(row.get("tokens_per_target_call"), "{:.2f}"),
            cell(runs.get("drafted_per_round"), "{:.2f}"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def oracle_section(results: dict[str, Any]) -> list[str]:
    """results.md's account of the oracle at every batch size it ran; nothing without it."""
    batches = dict(results.get("batches") or {})
    batches["1"] = {"methods": results["methods"]}  # batch 1's quality run is the one read
    sizes = sorted((s for s, b in batches.items() if ORACLE in b["methods"]), key=int)
    if not sizes:
        return []
    lines = [
        "## Against the oracle length",
        "",
        "`oracle` chooses, each round, the better at the run's cost model of a target-only "
        "step and each row drafting exactly what the target keeps plus the draft it rejects "
        "(all gamma_max when it keeps them all), found by a look-ahead that is not billed; a "
        "round that does not draft hands the rows those tokens one a round, so the law stays "
        "the target's. It is the most any length predictor can buy at this pair, cost and "
        "batch size, never below target_only but by the clock's noise. Each lossless length "
        "policy's share of its gain: (tokens/s − target_only's) / (oracle's − "
        "target_only's), and over sd with sd's tokens/s as the floor (1: the oracle; 0: no "
        "gain; below 0: a loss; – where the floor matched or beat the oracle).",
        "",
    ]
    for size in sizes:
        methods = batches[size]["methods"]
        oracle, alone = methods[ORACLE], methods.get("target_only") or {}
        lines += [
            f"Batch {size}: oracle {cell(oracle.get('tokens_per_s'), '{:.1f}')} tokens/s "
            f"({cell(oracle.get('tokens_per_target_call'), '{:.2f}')} tokens a target call, "
            f"{cell((oracle.get('draft_runs') or {}).get('drafted_per_round'), '{:.2f}')} "
            f"drafts a round), target_only {cell(alone.get('tokens_per_s'), '{:.1f}')}.",
            "",
            *oracle_table(methods),
            "",
        ]
    return lines
