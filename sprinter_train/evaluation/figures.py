"""The figures beside report.json: which plots stage=evaluate draws, from what, and where.

ROC per λ and per predictor (against both labels), the reliability diagram, each verifier's
reliability before and after its temperature, SV's table and its calibration when there is a
table, the learning curves when the verifiers carry them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from sprinter_train.evaluation.plots import (
    plot_calibration,
    plot_learning_curves,
    plot_reliability,
    plot_roc,
    plot_sv_calibration,
    plot_sv_table,
)
from sprinter_train.evaluation.sv_report import table_calibration
from sprinter_train.sv.table import SVTable
from sprinter_train.verifier.checkpoint import VerifierCheckpoint


def make_plots(
    out_dir: Path,
    metrics: dict[str, Any],
    verifiers: dict[str, VerifierCheckpoint],
    table: SVTable | None,
    frame: pd.DataFrame,
    learning: dict[str, Any],
    target_auc: float,
    calibration: dict[str, Any],
) -> list[Path]:
    """Draw every figure into `out_dir`; returns their paths in report order."""

    def curves(names, key="roc", auc_key="auc"):
        return {
            n: {**metrics[key][n], "auc": metrics[auc_key][n], "ci": metrics[f"{auc_key}_ci"][n]}
            for n in names
        }

    plots = [
        plot_roc(
            curves(verifiers), out_dir / "roc_per_lambda.png", "SPRINTER verifier per λ (q/p <= 1)"
        ),
        plot_roc(
            curves(metrics["roc"]), out_dir / "roc_predictors.png", "every predictor (q/p <= 1)"
        ),
        plot_roc(
            curves(metrics["roc"], "roc_sampled", "auc_sampled"),
            out_dir / "roc_predictors_sampled.png",
            "every predictor (sampled accept event)",
        ),
        plot_reliability(
            {
                label: {n: r[key] for n, r in metrics["reliability"].items()}
                for label, key in (("q/p <= 1", "q_le_p"), ("the sampled accept event", "sampled"))
            },
            out_dir / "reliability.png",
        ),
    ]
    if calibration:
        plots.append(plot_calibration(calibration, out_dir / "reliability_verifiers.png"))
    if table is not None:
        calib = table_calibration(table, frame)
        plots.append(
            plot_sv_calibration(
                calib["predicted"],
                calib["observed"],
                calib["counts"],
                out_dir / "sv_table_calibration.png",
            )
        )
        entry = table.meta["binnings"][table.binning.name]
        plots.append(
            plot_sv_table(entry, out_dir / "sv_table.png", f"SV table ({table.binning.name})")
        )
    if learning:
        plots.append(plot_learning_curves(learning, out_dir / "auc_vs_records.png", target_auc))
    return plots
