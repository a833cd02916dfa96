"""report.md's sections on what limits a verifier's AUC: whether it beats its own inputs,
its learning curve, the ceiling of the draft's features, the feature ablation, and the lines
that say why a verifier falls below evaluate.target_auc."""

from __future__ import annotations

from typing import Any

from sprinter_train.evaluation.report_format import fmt, fmt_ci, table
from sprinter_train.evaluation.selection import PREFIX


def beats_inputs_section(report: dict[str, Any]) -> str | None:
    """report.md's section of `beats_inputs`."""
    entry = report.get("beats_inputs")
    if not entry or not entry.get("versus"):
        return None
    verifiers = list(entry["versus"])
    header = "| rival | AUC (q/p <= 1) | " + " | ".join(f"{v} minus it" for v in verifiers) + " |"
    lines = [header, "|" + "---|" * (2 + len(verifiers))]
    order = sorted(entry["rivals"], key=lambda n: -(entry["rivals"][n]["auc"] or 0.0))
    for rival in order:
        cells = [fmt_ci(entry["rivals"][rival]["auc"], entry["rivals"][rival]["auc_ci"])]
        for name in verifiers:
            diff = entry["versus"][name][rival]
            cells.append(fmt_ci(diff["value"], diff["ci"]))
        lines.append(f"| {rival} | " + " | ".join(cells) + " |")
    parts = [
        "## Does each verifier beat its own inputs?",
        "Every hand rule of the report and every scalar input of the verifiers alone "
        f"(`{PREFIX}<feature>`, its sign chosen on the val split), on the same rows; each "
        "verifier's AUC minus the rival's with the paired prompt-bootstrap interval (above 0: "
        f"the verifier ranks better). Best rival: {entry.get('best_rival')}.",
        "\n".join(lines),
    ]
    rows = []
    for name, selection in (entry.get("selection") or {}).items():
        if not selection:
            rows.append(f"| {name} | (no selection: train.select off) | | |")
            continue
        for candidate, fit in selection["candidates"].items():
            kept = " **kept**" if candidate == selection["chosen"] else ""
            setting = ", ".join(
                f"{k} {v:g}" for k, v in fit.items() if k.startswith("l2_") and isinstance(v, float)
            )
            rows.append(
                f"| {name} | {f'{candidate} ({setting})' if setting else candidate} | "
                f"{fmt(fit['val_auc_q_le_p'])} | {fmt(fit.get('test_auc_q_le_p'))}{kept} |"
            )
    if rows:
        parts.append(
            "Model selection (train.select, in each sidecar): the candidates' AUC against "
            "q/p <= 1 on val, which chose (the simplest within the tie of the best), and on "
            "test, for the record.\n\n"
            "| verifier | candidate | val AUC | test AUC |\n|---|---|---|---|\n" + "\n".join(rows)
        )
    return "\n\n".join(parts)


def learning_section(report: dict[str, Any]) -> str | None:
    """AUC against train records per verifier, and what the slope says about more data."""
    curves = report.get("learning_curve") or {}
    if not curves:
        return None
    rows, lines = [], []
    for name, entry in curves.items():
        for point in entry["points"]:
            rows.append(
                [
                    name,
                    point["fraction"],
                    point["train_prompts"],
                    point["train_rows"],
                    point["val_auc_q_le_p"],
                    point["test_auc_q_le_p"],
                ]
            )
        need = entry["doublings_to_target_test"]
        if need is None:
            verdict = "the last doubling barely moved the test AUC: more records will not reach it"
        elif need == 0:
            verdict = "reached"
        else:
            verdict = f"{need:.1f} more doublings of the train records at the last doubling's gain"
        lines.append(
            f"- {name}: test AUC {fmt(entry['test_auc_per_doubling'])} per doubling of train "
            f"records fitted over the curve (val {fmt(entry['val_auc_per_doubling'])}), "
            f"{fmt(entry.get('test_auc_last_doubling'))} over the last doubling; AUC "
            f"{fmt(entry['target_auc'], 2)}: {verdict}"
        )
    return "\n\n".join(
        [
            "## Verifier AUC against training records (train.learning_curve)",
            table(
                ["verifier", "fraction", "train prompts", "train rows", "val AUC", "test AUC"],
                rows,
            ),
            "The curve's AUCs carry no interval: training does not keep the models of the "
            "smaller fractions to resample. The last point is the verifier itself; its interval "
            "is in the predictor table.",
            "\n".join(lines),
        ]
    )


def ceiling_section(report: dict[str, Any]) -> str | None:
    """evaluate.ceiling's models: whether training, inputs or the linear form limit the AUC."""
    entry = report.get("ceiling")
    if not entry:
        return None
    rows = [
        [name, m.get("setting"), m.get("val_auc"), fmt_ci(m.get("test_auc"), m.get("test_auc_ci"))]
        for name, m in entry["models"].items()
    ]
    counts = entry["rows"]
    return "\n\n".join(
        [
            "## What the draft's features can predict (evaluate.ceiling)",
            f"Fitted at q/p <= {entry['lam']:g} on {counts['train']} train records, "
            f"regularisation chosen on {counts['val']} val records, scored on {counts['test']} "
            "test records against q/p <= 1. The first linear row has the verifier's own input "
            "and tuned L2: if it matches the verifier, training is not the limit.",
            table(["model", "setting (C or alpha)", "val AUC", "test AUC"], rows),
            *([f"Note: {entry['embedding_skipped']}"] if entry.get("embedding_skipped") else []),
        ]
    )


def ablation_section(report: dict[str, Any]) -> str | None:
    """evaluate.ablation: drop-one and add-one AUCs of the feature groups."""
    entry = report.get("ablation")
    if not entry:
        return None
    skipped = [f"- {g}: {why}" for g, why in (entry.get("skipped") or {}).items()]
    if "all" not in entry:
        return "## Feature ablation (evaluate.ablation)\n\nNo group could be built:\n" + "\n".join(
            skipped
        )
    every = entry["all"]
    rows = [
        [
            "all groups",
            "+".join(every["groups"]),
            fmt_ci(every["test_auc"], every.get("test_auc_ci")),
            "",
        ]
    ]
    for group, fit in entry["drop_one"].items():
        rows.append(
            [
                f"drop {group}",
                "+".join(fit["groups"]),
                fmt_ci(fit["test_auc"], fit.get("test_auc_ci")),
                f"loss {fmt(fit['loss'])}",
            ]
        )
    if entry.get("base_fit"):
        base = entry["base_fit"]
        rows.append(
            [
                f"{entry['base']} alone",
                entry["base"],
                fmt_ci(base["test_auc"], base.get("test_auc_ci")),
                "",
            ]
        )
    for group, fit in entry["add_one"].items():
        change = f"gain {fmt(fit['gain'])}" if "gain" in fit else ""
        rows.append(
            [
                f"add {group}",
                "+".join(fit["groups"]),
                fmt_ci(fit["test_auc"], fit.get("test_auc_ci")),
                change,
            ]
        )
    counts = entry["rows"]
    parts = [
        "## Feature ablation (evaluate.ablation)",
        f"L2 logistic probes fitted at q/p <= {entry['lam']:g} on {counts['train']} train "
        f"records, C chosen on {counts['val']} val records, scored on the report's "
        f"{counts['test']} rows against q/p <= 1 (prompt-bootstrap intervals). Drop-one: all "
        f"groups but one (loss = all - it); add-one: {entry['add_one_mode']}. "
        f"{fmt(entry['seconds'], 1)} s.",
        table(["probe", "groups", "test AUC", ""], rows),
    ]
    if skipped:
        parts.append("Left out:\n" + "\n".join(skipped))
    return "\n\n".join(parts)


def shortfall_lines(report: dict[str, Any]) -> list[str]:
    """Why a verifier is below evaluate.target_auc, in numbers the report already holds."""
    target = report.get("target_auc")
    lines = []
    for name, value in report["auc"].items():
        if not name.startswith("verifier_") or value is None or target is None or value >= target:
            continue
        ci = report.get("auc_ci", {}).get(name)
        line = f"- **{name}: AUC {fmt_ci(value, ci)} < {fmt(target, 2)}.**"
        curve = (report.get("learning_curve") or {}).get(name)
        if curve and len(curve["points"]) > 1:
            before, after = curve["points"][-2], curve["points"][-1]
            gain = None
            if before["test_auc_q_le_p"] is not None and after["test_auc_q_le_p"] is not None:
                gain = after["test_auc_q_le_p"] - before["test_auc_q_le_p"]
            line += (
                f" Going from {before['train_rows']} to {after['train_rows']} train records moved "
                f"the test AUC by {fmt(gain)} (fitted over the whole curve: "
                f"{fmt(curve['test_auc_per_doubling'])} a doubling)."
            )
        ceiling_entry = report.get("ceiling")
        if ceiling_entry:
            best_name, best = max(
                ceiling_entry["models"].items(), key=lambda kv: kv[1].get("test_auc") or 0.0
            )
            line += (
                f" The best model on the draft's features, {best_name}, reaches "
                f"{fmt_ci(best.get('test_auc'), best.get('test_auc_ci'))} on the same test rows."
            )
        lines.append(line)
    return lines
