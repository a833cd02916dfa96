"""report.md's sections that set the records against theory: SV's information gain per
binning and SPRINTER's theorems 3.1, A.4 and 3.3."""

from __future__ import annotations

from typing import Any

from sprinter_train.evaluation.report_format import fmt, table


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
