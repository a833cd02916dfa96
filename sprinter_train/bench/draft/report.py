"""draft_eval's table, its verdicts against the targets and the model card section it writes."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sprinter_train.core.io import atomic_write

log = logging.getLogger(__name__)


def headline(alpha: float, c: float, best_speedup: float) -> dict[str, float]:
    """The three figures the draft is judged by."""
    return {"alpha": alpha, "c": c, "implied_speedup": best_speedup}


def meets(name: str, value: float, goal: float) -> bool:
    """c is a cost (lower is better); alpha and speedup are gains."""
    return value <= goal if name == "c" else value >= goal


def targets_met(targets: dict[str, float], values: dict[str, float]) -> dict[str, bool]:
    """Whether each headline figure meets its target."""
    return {name: meets(name, values[name], goal) for name, goal in targets.items()}


CARD_BEGIN, CARD_END = "<!-- draft_eval:begin -->", "<!-- draft_eval:end -->"


def update_model_card(card: Path, result: dict[str, Any], cfg: DictConfig) -> None:
    """Replace the card's measured-figures section with this run's (only cards we wrote)."""
    if not card.exists():
        log.warning("no model card at %s; figures stay in draft_eval.json", card)
        return
    text = card.read_text()
    section = (
        f"{CARD_BEGIN}\n## Measured (stage=draft_eval, {time.strftime('%Y-%m-%d', time.gmtime())})\n\n"
        f"`python -m sprinter_train stage=draft_eval experiment={cfg.experiment}` on "
        f"{result['device']} with {result['threads']} threads, {result['sequences']} held-out "
        f"replies ({cfg.draft_eval.source}, {cfg.draft_eval.split} split; {result['positions']} "
        f"positions):\n\n```\n{format_table(result)}\n```\n"
        f"{CARD_END}\n"
    )
    if CARD_BEGIN in text and CARD_END in text:
        head, rest = text.split(CARD_BEGIN, 1)
        text = head + section + rest.split(CARD_END, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    atomic_write(card, lambda tmp: tmp.write_text(text))


def format_table(result: dict[str, Any]) -> str:
    lines = [
        f"draft {result['draft']}  vs  target {result['target']}",
        "alpha: "
        + ", ".join(f"{k} {v:.3f}" for k, v in result["alpha_by_setting"].items())
        + f"  (default = {result['sampling']})",
        f"greedy agreement {result['greedy_agreement']:.3f} over {result['positions']} positions",
        f"step: draft {result['draft_step_ms']:.2f} ms, target {result['target_step_ms']:.2f} ms, "
        f"c = {result['c']:.3f}",
        "gamma | verify cost | implied speedup",
    ]
    for g, s in result["implied_speedup"].items():
        lines.append(f"{g:>5} | {result['verify_cost'][g]:>11.2f} | {s:>6.3f}")
    lines.append(
        f"best gamma {result['best_gamma']}: implied speedup "
        f"{result['implied_speedup'][result['best_gamma']]:.3f}"
    )
    if len(result.get("by_source", {})) > 1:
        lines.extend(format_sources(result["by_source"]))
    values = headline(result["alpha"], result["c"], result["implied_speedup"][result["best_gamma"]])
    for name, goal in result.get("targets", {}).items():
        sign = "<=" if name == "c" else ">="
        verdict = "met" if result["targets_met"][name] else "NOT met"
        lines.append(f"target {name} {sign} {goal}: {verdict} ({values[name]:.3f})")
    if "step_floor" in result:
        lines.extend(format_floor(result["step_floor"]))
    return "\n".join(lines)


def format_sources(by_source: dict[str, dict[str, Any]]) -> list[str]:
    """alpha per setting and greedy agreement of every source, the main one first."""
    settings = list(next(iter(by_source.values()))["alpha_by_setting"])
    names = {name: f"{name} ({entry['split']})" for name, entry in by_source.items()}
    width = max(len(label) for label in names.values())
    header = " | ".join(f"alpha {s}" for s in settings)
    lines = [f"{'source (split)':<{width}} | {header} | greedy | positions"]
    for name, entry in by_source.items():
        cells = " | ".join(f"{entry['alpha_by_setting'][s]:>{len(s) + 6}.3f}" for s in settings)
        lines.append(
            f"{names[name]:<{width}} | {cells} | {entry['greedy_agreement']:>6.3f} | "
            f"{entry['positions']:>9}"
        )
    return lines


def format_floor(floor: dict[str, Any]) -> list[str]:
    """The draft step against its floor, and the step targets (both costs: lower is better);
    a c target below the floor's own c is called unreachable at this format."""
    lines = [
        f"draft step at batch 1 after {floor['context_tokens']} cached tokens (median of "
        f"{floor['reps']} interleaved rounds):",
        f"  floor  {floor['floor_ms']:6.2f} ms  ({floor['floor_matmuls']} matmuls over "
        f"{floor['floor_parameters'] / 1e6:.2f}M weights, {floor['floor_weight_mb']:.1f} MB: "
        f"{floor['floor_gb_per_s']:.1f} GB/s)",
        f"  model  {floor['model_step_ms']:6.2f} ms  ({floor['model_over_floor']:.2f}x the floor)",
        f"  engine {floor['engine_step_ms']:6.2f} ms  ({floor['engine_over_floor']:.2f}x the floor)",
        f"  target {floor['target_step_ms']:6.2f} ms  (c: engine {floor['c_engine']:.3f}, "
        f"floor {floor['c_floor']:.3f})",
    ]
    for name, goal in floor.get("targets", {}).items():
        verdict = "met" if floor["targets_met"][name] else "NOT met"
        line = f"target {name} <= {goal}: {verdict} ({floor[name]:.3f})"
        if name == "c_engine" and floor["c_floor"] > goal:
            line += (
                f"; unreachable at this format: the floor alone gives c = {floor['c_floor']:.3f}"
            )
        lines.append(line)
    return lines
