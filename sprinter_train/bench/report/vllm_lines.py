"""results.md's vLLM section: each vLLM peer (bench/peers/vllm_peer.py) at every batch size,
with what vLLM reports of itself beside the bench's figures."""

from __future__ import annotations

from typing import Any

from sprinter_train.bench.peers.vllm_peer import VLLM_NAMES
from sprinter_train.bench.report.cells import cell


def vllm_section(results: dict[str, Any]) -> list[str]:
    """A table of the vLLM peers that ran: tokens/s, speedup over target_only, vLLM's
    acceptance and drafts a round, outputs differing from target_only's (greedy) per batch
    size; beneath, how they ran (vLLM's version, dtype, threads, drafts a round, engine
    start-up). Nothing when none ran."""
    settings = results.get("settings") or {}
    ran = [n for n in VLLM_NAMES if (settings.get(n) or {}).get("run")]
    if not ran:
        return []
    batches = results.get("batches") or {}
    lines = [
        "## vLLM",
        "",
        "vLLM's peers, each in a process of its own on the same prompts, sampling, seeds and "
        "budget, in the same groups at every batch size, timed after one untimed warm-up per "
        "batch size (`bench.vllm`); the engine's start-up is untimed. `acceptance`: vLLM's "
        "accepted over drafted tokens; `drafts a round`: drafted tokens over drafting rounds.",
        "",
        "| method | batch | tokens/s | × target_only | acceptance | drafts a round "
        "| outputs ≠ target_only |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in ran:
        for size, batch in sorted(batches.items(), key=lambda kv: int(kv[0])):
            row = (batch.get("methods") or {}).get(name)
            if row is None:
                continue
            figures = row.get("vllm") or {}
            differing = row.get("outputs_differing_from_target_only")
            if size == "1":
                differing = (results["methods"].get(name) or {}).get(
                    "outputs_differing_from_target_only"
                )
            cells = [
                name,
                size,
                cell(row.get("tokens_per_s"), "{:.1f}"),
                cell(row.get("speedup_vs_target_only"), "{:.2f}"),
                cell(figures.get("acceptance"), "{:.3f}"),
                cell(figures.get("drafts_per_round"), "{:.2f}"),
                cell(differing, "{:d}"),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for name in ran:
        own, run = settings[name], settings[name]["run"]
        drafts = own.get("num_speculative_tokens")
        versions = ", ".join(f"{k} {v}" for k, v in (run.get("versions") or {}).items())
        lines.append(
            f"- {name}: {versions or 'vLLM ' + str(own.get('vllm_version'))}, {own.get('dtype')}, "
            f"{run.get('threads')} threads"
            + (f", {drafts} drafts a round at most" if drafts else "")
            + (", its predictor from " + f"`{own['predictor']}`" if own.get("predictor") else "")
            + f"; engine start-up {run['startup_s']:.1f} s."
        )
    return [*lines, ""]
