"""report.md: the numbers of report.json as tables a person reads, put together from the
sections of predictor_sections.py, theory_sections.py and limit_sections.py."""

from __future__ import annotations

from typing import Any

from sprinter_train.evaluation.limit_sections import (
    ablation_section,
    beats_inputs_section,
    ceiling_section,
    learning_section,
    shortfall_lines,
)
from sprinter_train.evaluation.predictor_sections import (
    calibration_section,
    mix_section,
    predictor_section,
)
from sprinter_train.evaluation.report_format import fmt, fmt_ci, table
from sprinter_train.evaluation.theory_sections import information_section, theorem_section


def render_markdown(report: dict[str, Any]) -> str:
    balance = report["label_balance"]
    parts = [
        f"# Acceptance predictors: {report['experiment']}",
        f"{report['rows']} records of {report['prompts']} prompts ({report['split']} split). "
        f"Acceptable (q/p <= 1): {fmt(balance['q_le_p'])}; sampled accept event: "
        f"{fmt(balance['sampled_accept'])}.",
        predictor_section(report),
        information_section(report),
        "## SVIP: draft entropy at accepted and rejected tokens (nats)\n\n"
        + table(
            ["", "accepted", "rejected"],
            [
                ["sampled accept event", report["entropy_accepted"], report["entropy_rejected"]],
                ["label q/p <= 1", report["by_label"]["q_le_p"], report["by_label"]["q_gt_p"]],
            ],
        ),
        theorem_section(report),
    ]
    why = shortfall_lines(report)
    extra = [
        beats_inputs_section(report),
        calibration_section(report),
        mix_section(report),
        "## Below the target AUC, and why\n\n" + "\n".join(why) if why else None,
        learning_section(report),
        ceiling_section(report),
        ablation_section(report),
    ]
    parts[3:3] = [section for section in extra if section]
    if report.get("transfer"):
        rows = [
            [
                other,
                entry.get("prompts"),
                name,
                fmt_ci(value, entry.get("auc_ci", {}).get(name)),
                fmt_ci(entry["auc_sampled"].get(name), entry.get("auc_sampled_ci", {}).get(name)),
            ]
            for other, entry in report["transfer"].items()
            for name, value in entry["auc"].items()
        ]
        parts.append(
            "## Transfer (this experiment's verifiers on other test records)\n\n"
            "Intervals: the same bootstrap over the other records' test prompts.\n\n"
            + table(["records", "prompts", "verifier", "AUC (q/p <= 1)", "AUC (sampled)"], rows)
        )
    parts.append("## Plots\n\n" + "\n".join(f"- `{p}`" for p in report["plots"]))
    if report.get("notes"):
        parts.append("## Notes\n\n" + "\n".join(f"- {n}" for n in report["notes"]))
    return "\n\n".join(parts) + "\n"
