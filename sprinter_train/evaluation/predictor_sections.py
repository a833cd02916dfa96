"""report.md's sections on every predictor: AUC with intervals, ECE, Brier and η on the same
rows, each verifier's calibration before and after its temperature, and AUC per prefix mix."""

from __future__ import annotations

from typing import Any

from sprinter_train.evaluation.report_format import fmt, fmt_before_after, fmt_ci, table


def predictor_section(report: dict[str, Any]) -> str:
    rows = []
    for name in report["auc"]:
        calib = report["calibration"].get(name) or {}
        rows.append(
            [
                name,
                fmt_ci(report["auc"][name], report["auc_ci"].get(name)),
                fmt_ci(report["auc_sampled"].get(name), report["auc_sampled_ci"].get(name)),
                calib.get("ece_q_le_p"),
                calib.get("brier_q_le_p"),
                calib.get("ece_sampled"),
                calib.get("brier_sampled"),
            ]
        )
    header = [
        "predictor",
        "AUC (q/p <= 1)",
        "AUC (sampled accept)",
        "ECE (q/p <= 1)",
        "Brier (q/p <= 1)",
        "ECE (sampled)",
        "Brier (sampled)",
    ]
    eta_rows = []
    for name, by_tau in report["eta"].items():
        eta_rows.append(
            [name] + [f"{fmt(v['eta_TP'])} / {fmt(v['eta_FP'])}" for v in by_tau.values()]
        )
    taus = list(next(iter(report["eta"].values()), {}).keys())
    boot = report["bootstrap"]
    paired = [
        f"- {name}: {fmt_ci(entry['value'], entry['ci'])}"
        for name, entry in report["auc_minus_draft_q"].items()
    ]
    parts = [
        "## Every predictor on the same rows",
        f"AUCs with {boot['level']:.0%} intervals in brackets: percentile bootstrap over the "
        f"{boot['prompts']} {report['split']} prompts ({boot['resamples']} resamples of the "
        f"prompts with replacement, each drawn prompt bringing all its rows; seed "
        f"{boot['seed']}). ECE and Brier are of the raw scores (verifiers: before their "
        "temperature).",
        table(header, rows),
    ]
    if paired:
        parts.append(
            "Verifier AUC minus q(x)'s (q/p <= 1), paired over the same resamples (an interval "
            "above 0: the verifier ranks better than the draft's own probability):\n\n"
            + "\n".join(paired)
        )
    parts += [
        "η_TP / η_FP against q/p <= 1 (accept when the score >= τ):",
        table(["predictor"] + [f"τ = {t}" for t in taus], eta_rows),
    ]
    return "\n\n".join(parts)


def calibration_section(report: dict[str, Any]) -> str | None:
    """Each verifier's ECE and Brier before -> after the temperature in its sidecar."""
    entries = report.get("verifier_calibration") or {}
    if not entries:
        return None
    rows = [
        [
            name,
            entry["label"],
            fmt(entry["temperature"]) + ("" if entry["fitted_on"] else " (none fitted)"),
            entry["target"],
            fmt_before_after(entry["own_target"], "ece"),
            fmt_before_after(entry["own_target"], "brier"),
            fmt_before_after(entry["sampled"], "ece"),
            fmt_before_after(entry["sampled"], "brier"),
        ]
        for name, entry in entries.items()
    ]
    return "\n\n".join(
        [
            "## Verifier calibration: before -> after the temperature (sigmoid(logit / T))",
            "Each verifier against its own target, the one its temperature is fitted to "
            "(q/p <= λ for the λ verifiers; for the soft-label verifier, min(1, p/q), the "
            "probability that speculative sampling accepts the token: a bin's observed rate is "
            "its mean min(1, p/q) and Brier the squared error to it), and against the sampled "
            "accept event u < min(1, p/q), the event a goodput plan spends. "
            f"{fmt(report['config']['ece_bins'])} equal-width bins; the diagram is "
            "`reliability_verifiers.png`.",
            table(
                [
                    "verifier",
                    "label",
                    "T",
                    "own target",
                    "ECE (own)",
                    "Brier (own)",
                    "ECE (sampled)",
                    "Brier (sampled)",
                ],
                rows,
            ),
        ]
    )


def mix_section(report: dict[str, Any]) -> str | None:
    """Each predictor's AUC (q/p <= 1) with its interval on every mix, and all together."""
    by_mix = report.get("by_mix") or {}
    if not by_mix:
        return None
    mixes = list(by_mix)
    names = list(next(iter(by_mix.values()))["auc"])
    rows = [
        [name] + [fmt_ci(by_mix[m]["auc"].get(name), by_mix[m]["auc_ci"].get(name)) for m in mixes]
        for name in names
    ]
    header = ["predictor"] + [f"{m} ({by_mix[m]['prompts']} prompts)" for m in mixes]
    named = [
        f"- {label}: {fmt_ci(entry['auc'], entry['auc_ci'])}"
        for label, entry in (report.get("verifier_by_mix") or {}).items()
    ]
    parts = [
        "## Every predictor on each prefix mix (AUC against q/p <= 1)",
        "Each mix's interval resamples that mix's own prompts (each prompt is of one mix); "
        "`all` is every row, the predictor table's AUC. The verifiers were trained on all "
        "four mixes; `interleaved` is the prefix a decoder's verifier sees, `original` "
        "SPRINTER Fig. 3's.",
        table(header, rows),
    ]
    if named:
        parts.append("\n".join(named))
    return "\n\n".join(parts)
