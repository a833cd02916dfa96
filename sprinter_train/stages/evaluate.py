"""stage=evaluate: every acceptance predictor on the same test rows, one report.

python -m sprinter_train stage=evaluate experiment=<exp> [evaluate.transfer=[<other_exp>]]

Reads artifacts/<exp>/records/ (stage=harvest), checkpoints/<exp>/verifier-lam<λ>.* and, when
trained, verifier-accept.* (stage=train) and artifacts/<exp>/tables/sv_table.json (stage=tables;
only when the records have S and A). Writes artifacts/<exp>/eval/report.json, report.md and the
plots (ROC per λ, ROC per predictor, reliability diagrams, SV table calibration). Each section
is built by a module of sprinter_train/evaluation/; this one reads, calls them in report order
and writes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sprinter_train.core import pidlock
from sprinter_train.core.io import write_json
from sprinter_train.core.rules import sampled_acceptance
from sprinter_train.core.runtime import set_threads
from sprinter_train.evaluation.ablation import ablation_report
from sprinter_train.evaluation.bootstrap import PromptBootstrap
from sprinter_train.evaluation.calibration import calibration_report
from sprinter_train.evaluation.ceiling_report import ceiling_report
from sprinter_train.evaluation.entropy_table import entropy_table
from sprinter_train.evaluation.figures import make_plots
from sprinter_train.evaluation.inputs import input_provenance, load_inputs, stale_input_notes
from sprinter_train.evaluation.learning import summarise as summarise_learning
from sprinter_train.evaluation.metrics import score_metrics
from sprinter_train.evaluation.mixes import mix_metrics, named_rows
from sprinter_train.evaluation.report_md import render_markdown
from sprinter_train.evaluation.scores import (
    predictor_descriptions,
    predictor_scores,
    unscored_notes,
    verifier_logits,
)
from sprinter_train.evaluation.selection import beats_inputs
from sprinter_train.evaluation.strict_json import strict_json
from sprinter_train.evaluation.sv_report import NO_TABLE_NOTE, information_report
from sprinter_train.evaluation.theory_checks import check_verifiers
from sprinter_train.evaluation.transfer import transfer_report
from sprinter_train.harvest.manifest import code_version

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> dict[str, Any]:
    with pidlock.experiment_writer(cfg.experiment_dir, "evaluate"):
        return _run(cfg)


def _run(cfg: DictConfig) -> dict[str, Any]:
    set_threads(cfg.get("num_threads"))
    ecfg = cfg.evaluate
    records, verifiers, table = load_inputs(cfg)
    rows = records.rows_of(str(ecfg.split))
    if len(rows) == 0:
        raise ValueError(f"stage=evaluate: the records hold no {ecfg.split!r} rows")
    frame = records.frame.iloc[rows]
    y_label = frame["ratio"].to_numpy() <= 1.0
    y_event = sampled_acceptance(frame["accept_prob"].to_numpy(), int(ecfg.seed))
    logits = verifier_logits(cfg, records, rows, verifiers)
    scores = predictor_scores(cfg, records, rows, logits, table)
    bootstrap = PromptBootstrap.from_cfg(ecfg.bootstrap, frame["prompt_id"].to_numpy())
    metrics = score_metrics(scores, y_label, y_event, ecfg, bootstrap)
    calibration = calibration_report(verifiers, logits, frame, y_event, int(ecfg.ece_bins))
    by_mix = mix_metrics(
        scores,
        y_label,
        frame["mix"].to_numpy(),
        frame["prompt_id"].to_numpy(),
        ecfg.bootstrap,
        [str(m) for m in ecfg.mixes],
    )
    notes = unscored_notes(cfg, frame.columns)
    if table is None:
        for key in ("auc", "auc_ci", "auc_sampled_ci"):
            metrics[key]["sv_table"] = None
        notes.append(NO_TABLE_NOTE)
    information_detail, info_gain = ({}, None)
    if table is not None:
        information_detail, info_gain = information_report(records, table, rows)
    theorems = check_verifiers(
        frame, scores, list(verifiers), float(ecfg.tau), int(ecfg.seed), list(ecfg.theorem_mixes)
    )
    out_dir = Path(cfg.experiment_dir) / "eval"
    learning = summarise_learning(
        {n: c.meta.get("metrics", {}).get("learning_curve") for n, c in verifiers.items()},
        float(ecfg.target_auc),
    )
    plots = make_plots(
        out_dir, metrics, verifiers, table, frame, learning, float(ecfg.target_auc), calibration
    )
    report = {
        "stage": "evaluate",
        "experiment": str(cfg.experiment),
        "split": str(ecfg.split),
        "rows": len(rows),
        "prompts": int(frame["prompt_id"].nunique()),
        "label_balance": {
            "q_le_p": float(y_label.mean()),
            "sampled_accept": float(y_event.mean()),
        },
        "auc": metrics["auc"],
        "auc_ci": metrics["auc_ci"],
        "auc_sampled": metrics["auc_sampled"],
        "auc_sampled_ci": metrics["auc_sampled_ci"],
        "auc_minus_draft_q": metrics["auc_minus_draft_q"],
        "beats_inputs": beats_inputs(records, rows, verifiers, scores, y_label, bootstrap),
        "by_mix": by_mix,
        "verifier_by_mix": named_rows(by_mix, list(verifiers)),
        "bootstrap": bootstrap.describe(),
        "calibration": metrics["calibration"],
        "verifier_calibration": calibration,
        "eta": metrics["eta"],
        "info_gain_bits": info_gain,
        "information": information_detail,
        **entropy_table(frame, y_event, y_label),
        "theorem_checks": theorems,
        "learning_curve": learning,
        "ceiling": ceiling_report(cfg, records),
        "ablation": ablation_report(cfg, records, rows),
        "target_auc": float(ecfg.target_auc),
        "transfer": transfer_report(cfg, verifiers),
        "predictors": predictor_descriptions(cfg, verifiers),
        "inputs": input_provenance(cfg, records, verifiers, table),
        "roc": metrics["roc"],
        "reliability": metrics["reliability"],
        "plots": [str(p.relative_to(out_dir)) for p in plots],
        "notes": notes,
        "config": OmegaConf.to_container(ecfg, resolve=True),
        "code_version": code_version(),
    }
    notes.extend(stale_input_notes(report["inputs"]))
    report = strict_json(report)
    write_json(out_dir / "report.json", report)
    (out_dir / "report.md").write_text(render_markdown(report))
    log.info("evaluate: AUC against q/p <= 1: %s", report["auc"])
    return {
        "report": str(out_dir / "report.json"),
        "rows": len(rows),
        "auc": report["auc"],
        "auc_ci": report["auc_ci"],
        "info_gain_bits": report["info_gain_bits"],
        "entropy_accepted": report["entropy_accepted"],
        "entropy_rejected": report["entropy_rejected"],
    }
