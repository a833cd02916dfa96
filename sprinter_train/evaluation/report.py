"""report.md: the numbers of report.json as tables a person reads."""

from __future__ import annotations

from typing import Any

from sprinter_train.evaluation.selection import PREFIX


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def fmt_ci(value: Any, ci: list[float] | None, digits: int = 3) -> str:
    """'0.730 [0.690, 0.770]': a value and its interval (the value alone when it has none)."""
    if value is None or not ci:
        return fmt(value, digits)
    return f"{fmt(value, digits)} [{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]"


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


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


def fmt_before_after(entry: dict[str, float], metric: str) -> str:
    return f"{fmt(entry[f'{metric}_before'])} -> {fmt(entry[f'{metric}_after'])}"


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


def binning_order(name: str) -> tuple[int, int]:
    """5x5, 10x10, 20x20, then adaptive (JSON keys come back sorted as text)."""
    head = name.split("x")[0]
    return (0, int(head)) if head.isdigit() else (1, 0)


def information_section(report: dict[str, Any]) -> str:
    if not report.get("information"):
        return "## SV information gain\n\nNo SV table (the records have no S and A)."
    rows = []
    for name, entry in sorted(report["information"].items(), key=lambda kv: binning_order(kv[0])):
        fit, test, held = entry["fit"], entry["test"], entry["heldout"]
        rows.append(
            [
                name,
                fit["H_X"],
                fit["H_X_given_Y"],
                fit["I"],
                fit["I_miller_madow"],
                test["I"],
                held["I_heldout"],
            ]
        )
    return "\n\n".join(
        [
            "## SV information gain (bits; X = min(1, p/q) in equal-width bins)",
            table(
                [
                    "binning",
                    "H(X) fit",
                    "H(X|S,A) fit",
                    "I fit (plug-in)",
                    "I fit (Miller-Madow)",
                    "I test (plug-in)",
                    "I held-out",
                ],
                rows,
            ),
            f"`info_gain_bits` (default binning, test split, plug-in): {fmt(report['info_gain_bits'])}. "
            "'I held-out' scores test X under the fit split's P(X) and P(X | S, A); "
            "it is negative when the cells overfit.",
        ]
    )


def theorem_section(report: dict[str, Any]) -> str:
    rows31, rows_a4, rows33 = [], [], []
    for name, check in report["theorem_checks"].items():
        if "theorem_3_1" not in check:
            continue
        t31, ta4, t33 = check["theorem_3_1"], check["theorem_A_4"], check["theorem_3_3"]
        rows31.append(
            [name, check["eta_FP"], check["d_TV_pq"], t31["predicted_d_TV"], t31["measured_d_TV"]]
        )
        rows_a4.append(
            [
                name,
                ta4["beta_SD"],
                ta4["predicted_beta"],
                ta4["expected_beta"],
                f"{fmt(ta4['simulated_beta'])} ± {fmt(ta4['simulated_se'])}",
            ]
        )
        rows33.append(
            [
                name,
                check["eta_TP"],
                check["eta_FP"],
                t33.get("starts"),
                t33.get("mean_r"),
                t33.get("predicted_E_N"),
                t33.get("observed_N"),
            ]
        )
    tau = next(iter(report["theorem_checks"].values()), {}).get("tau")
    return "\n\n".join(
        [
            f"## SPRINTER theorems against the records (τ = {fmt(tau, 2)})",
            "Theorem 3.1, d_TV(p, p_SPRINTER) = η_FP · d_TV(p, q):",
            table(["verifier", "η_FP", "mean d_TV(p,q)", "predicted", "measured"], rows31),
            "Theorem A.4, acceptance rate 1 - (1 - η_FP) d_TV(p, q):",
            table(
                ["verifier", "SD (η_FP = 0)", "predicted", "expected on records", "simulated ± se"],
                rows_a4,
            ),
            "Theorem 3.3, E[min(N, L)] from η_TP, η_FP and each start's run r (draft/interleaved sequences):",
            table(
                ["verifier", "η_TP", "η_FP", "starts", "mean r", "predicted E[N]", "observed N"],
                rows33,
            ),
        ]
    )


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
