"""stage=evaluate: every acceptance predictor on the same test rows, one report.

python -m sprinter_train stage=evaluate experiment=<exp> [evaluate.transfer=[<other_exp>]]

Reads artifacts/<exp>/records/ (stage=harvest), checkpoints/<exp>/verifier-lam<λ>.* (stage=train)
and artifacts/<exp>/tables/sv_table.json (stage=tables; only when the records have S and A).
Writes artifacts/<exp>/eval/report.json, report.md and the plots (ROC per λ, ROC per
predictor, reliability diagram, SV table calibration).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from sprinter_train.core.classification import auc, brier, ece, eta_rates, reliability, roc
from sprinter_train.core.io import write_json
from sprinter_train.core.runtime import set_threads
from sprinter_train.evaluation.ceiling import ceiling
from sprinter_train.evaluation.information import discretise, heldout_information, information
from sprinter_train.evaluation.learning import summarise as summarise_learning
from sprinter_train.evaluation.plots import (
    plot_learning_curves,
    plot_reliability,
    plot_roc,
    plot_sv_calibration,
    plot_sv_table,
)
from sprinter_train.evaluation.predictors import (
    adaedl_bound,
    draft_q,
    sampled_acceptance,
    svip_score,
)
from sprinter_train.evaluation.report import render_markdown
from sprinter_train.evaluation.theory_checks import theorem_checks
from sprinter_train.harvest.manifest import code_version
from sprinter_train.harvest.reader import RecordSet, file_sha256, open_records
from sprinter_train.sv.table import SVTable
from sprinter_train.verifier.checkpoint import (
    VerifierCheckpoint,
    lam_name,
    load_verifier,
    verifier_path,
)
from sprinter_train.verifier.features import FeatureSpec, build_features
from sprinter_train.verifier.train import make_embedder

log = logging.getLogger(__name__)

COLUMNS = [
    "prompt_id",
    "split",
    "mix",
    "position",
    "token_id",
    "q",
    "ratio",
    "accept_prob",
    "beta",
    "draft_entropy",
    "S",
    "A",
]
BASELINES = ("svip_entropy", "adaedl_bound", "draft_q")


def load_inputs(cfg: DictConfig) -> tuple[RecordSet, dict[str, VerifierCheckpoint], SVTable | None]:
    """Records, verifiers and table, each checked on entry (errors name the stage to run)."""
    records = open_records(cfg.experiment_dir, columns=COLUMNS, stage="stage=evaluate")
    verifiers = {
        f"verifier_lam{lam_name(lam)}": load_verifier(
            verifier_path(cfg.checkpoint_dir, float(lam)), str(cfg.experiment)
        )
        for lam in cfg.evaluate.lams
    }
    table = None
    if records.has_companion:
        table = SVTable.load(Path(cfg.experiment_dir) / "tables" / "sv_table.json")
    return records, verifiers, table


def verifier_scores(
    cfg: DictConfig, records: RecordSet, rows: np.ndarray, verifiers: dict[str, VerifierCheckpoint]
) -> dict[str, np.ndarray]:
    """Each verifier's sigmoid score on the given rows (hidden states read once)."""
    hidden = records.hidden(rows)
    columns = {c: records.frame[c].to_numpy()[rows] for c in ("q", "draft_entropy", "token_id")}
    out = {}
    for name, checkpoint in verifiers.items():
        if int(checkpoint.meta["d"]) != records.d:
            raise ValueError(
                f"{name} was trained on d={checkpoint.meta['d']} hidden states; the records of "
                f"{records.records_dir} have d={records.d} (another draft or layer)"
            )
        embedder = make_embedder(cfg, checkpoint.spec, records)
        features = build_features(checkpoint.spec, hidden, columns, embedder)
        out[name] = checkpoint.score(features.batch())
    return out


def predictor_scores(
    cfg: DictConfig,
    records: RecordSet,
    rows: np.ndarray,
    verifiers: dict[str, VerifierCheckpoint],
    table: SVTable | None,
) -> dict[str, np.ndarray]:
    """P(accept) estimates of every predictor on the same rows."""
    frame = records.frame.iloc[rows]
    scores = verifier_scores(cfg, records, rows, verifiers)
    if table is not None:
        scores["sv_table"] = np.asarray(table.lookup(frame["S"].to_numpy(), frame["A"].to_numpy()))
    entropy = frame["draft_entropy"].to_numpy()
    scores["svip_entropy"] = svip_score(entropy, float(cfg.evaluate.svip_c))
    scores["adaedl_bound"] = adaedl_bound(entropy, float(cfg.evaluate.adaedl_gamma))
    scores["draft_q"] = draft_q(frame["q"].to_numpy())
    return scores


def score_metrics(
    scores: dict[str, np.ndarray], y_label: np.ndarray, y_event: np.ndarray, ecfg: DictConfig
) -> dict[str, Any]:
    bins = int(ecfg.ece_bins)
    out: dict[str, Any] = {
        "auc": {},
        "auc_sampled": {},
        "calibration": {},
        "eta": {},
        "roc": {},
        "roc_sampled": {},
        "reliability": {},
    }
    for name, s in scores.items():
        out["auc"][name] = auc(y_label, s)
        out["auc_sampled"][name] = auc(y_event, s)
        out["calibration"][name] = {
            "ece_q_le_p": ece(y_label, s, bins),
            "brier_q_le_p": brier(y_label, s),
            "ece_sampled": ece(y_event, s, bins),
            "brier_sampled": brier(y_event, s),
        }
        out["eta"][name] = {f"{tau:g}": eta_rates(y_label, s, float(tau)) for tau in ecfg.taus}
        out["roc"][name] = roc(y_label, s)
        out["roc_sampled"][name] = roc(y_event, s)
        out["reliability"][name] = {
            "q_le_p": reliability(y_label, s, bins),
            "sampled": reliability(y_event, s, bins),
        }
    return out


def information_report(
    records: RecordSet, table: SVTable, test_rows: np.ndarray
) -> tuple[dict[str, Any], float]:
    """Per binning: entropies on the fit split (from the table), on the test split, and the
    held-out gain; returns the test plug-in I(X; S, A) of the default binning too."""
    payload = table.meta
    x_bins = int(payload["config"]["x_bins"])
    frame = records.frame
    fit_rows = np.flatnonzero(frame["split"].isin(payload["fit_splits"]).to_numpy())
    x = discretise(frame["accept_prob"].to_numpy(), x_bins)
    out: dict[str, Any] = {}
    for name in payload["binnings"]:
        binning = SVTable.from_json(payload, name).binning
        cells = binning.flat(frame["S"].to_numpy(), frame["A"].to_numpy())
        out[name] = {
            "fit": payload["binnings"][name]["entropy_bits"]["X"],
            "test": information(x[test_rows], cells[test_rows]),
            "heldout": heldout_information(
                x[fit_rows], cells[fit_rows], x[test_rows], cells[test_rows], x_bins
            ),
        }
    return out, out[payload["default"]]["test"]["I"]


def table_calibration(table: SVTable, frame) -> dict[str, np.ndarray]:
    """Per cell: the table's value and the test split's mean min(1, p/q) and count."""
    flat = table.binning.flat(frame["S"].to_numpy(), frame["A"].to_numpy())
    cells = table.p_accept.size
    counts = np.bincount(flat, minlength=cells)
    sums = np.bincount(flat, weights=frame["accept_prob"].to_numpy(), minlength=cells)
    with np.errstate(invalid="ignore", divide="ignore"):
        observed = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return {"predicted": table.p_accept.ravel(), "observed": observed, "counts": counts}


def entropy_table(frame, y_event: np.ndarray, y_label: np.ndarray) -> dict[str, Any]:
    """SVIP Table 1: mean draft entropy (nats) at accepted and at rejected draft tokens."""
    h = frame["draft_entropy"].to_numpy(dtype=np.float64)

    def mean(mask: np.ndarray) -> float | None:
        return float(h[mask].mean()) if mask.any() else None

    return {
        "entropy_accepted": mean(y_event),
        "entropy_rejected": mean(~y_event),
        "by_label": {"q_le_p": mean(y_label), "q_gt_p": mean(~y_label)},
        "unit": "nats",
        "accepted_means": "the sampled accept event u < min(1, p/q)",
    }


def transfer_report(cfg: DictConfig, verifiers: dict[str, VerifierCheckpoint]) -> dict[str, Any]:
    """SPRINTER Table 4: this experiment's verifiers on other experiments' test records."""
    out: dict[str, Any] = {}
    for other in cfg.evaluate.transfer:
        other_dir = Path(cfg.artifacts_root) / str(other)
        records = open_records(
            other_dir, columns=COLUMNS, stage="stage=evaluate (evaluate.transfer)"
        )
        for name, checkpoint in verifiers.items():
            mine = (checkpoint.meta.get("draft_model"), checkpoint.meta.get("hidden_layer"))
            theirs = (
                records.manifest.get("models", {}).get("draft", {}).get("id"),
                records.manifest["hidden"]["layer"],
            )
            if mine != theirs:
                raise ValueError(
                    f"evaluate.transfer: {name} reads hidden layer {mine[1]} of draft {mine[0]}, "
                    f"the records of {other} hold layer {theirs[1]} of {theirs[0]}"
                )
        rows = records.rows_of(str(cfg.evaluate.split))
        frame = records.frame.iloc[rows]
        y_label = frame["ratio"].to_numpy() <= 1.0
        y_event = sampled_acceptance(frame["accept_prob"].to_numpy(), int(cfg.evaluate.seed))
        scores = verifier_scores(cfg, records, rows, verifiers)
        out[str(other)] = {
            "rows": len(rows),
            "records_manifest_sha256": records.manifest_hash,
            "auc": {n: auc(y_label, s) for n, s in scores.items()},
            "auc_sampled": {n: auc(y_event, s) for n, s in scores.items()},
        }
    return out


def ceiling_report(cfg: DictConfig, records: RecordSet) -> dict[str, Any] | None:
    """evaluate.ceiling: what the draft's features predict, linear or not (see ceiling.py),
    on at most `max_train_rows` train rows (a random subset) and every val and test row."""
    ccfg = cfg.evaluate.ceiling
    if not ccfg.enabled:
        return None
    frame = records.frame
    split = frame["split"].to_numpy()
    rng = np.random.default_rng(int(cfg.evaluate.seed))
    train = np.flatnonzero(split == "train")
    if len(train) > int(ccfg.max_train_rows):
        train = np.sort(rng.choice(train, int(ccfg.max_train_rows), replace=False))
    rows = np.sort(np.concatenate([train, np.flatnonzero((split == "val") | (split == "test"))]))
    embedding, skipped = None, None
    if ccfg.embedding:
        try:
            embedder = make_embedder(cfg, FeatureSpec(("hidden", "token_embedding")), records)
            embedding = embedder(frame["token_id"].to_numpy()[rows])
        except (ValueError, OSError) as error:  # another models.draft, or no way to load it
            skipped = f"the draft's embedding of x was left out: {error}"
            log.warning("evaluate.ceiling: %s", skipped)
    lam = float(ccfg.lam)
    models = ceiling(
        records.hidden(rows),
        frame["q"].to_numpy()[rows],
        frame["draft_entropy"].to_numpy()[rows],
        frame["ratio"].to_numpy()[rows],
        split[rows],
        lam,
        embedding=embedding,
        c_grid=list(ccfg.c_grid),
        mlp_hidden=int(ccfg.mlp_hidden),
        mlp_alphas=list(ccfg.mlp_alphas),
        seed=int(cfg.evaluate.seed),
    )
    counts = {s: int((split[rows] == s).sum()) for s in ("train", "val", "test")}
    return {"lam": lam, "rows": counts, "models": models, "embedding_skipped": skipped}


def finite(value: Any) -> Any:
    """NaN and infinities become None: report.json stays strict JSON."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def run(cfg: DictConfig) -> dict[str, Any]:
    set_threads(cfg.get("num_threads"))
    ecfg = cfg.evaluate
    records, verifiers, table = load_inputs(cfg)
    rows = records.rows_of(str(ecfg.split))
    if len(rows) == 0:
        raise ValueError(f"stage=evaluate: the records hold no {ecfg.split!r} rows")
    frame = records.frame.iloc[rows]
    y_label = frame["ratio"].to_numpy() <= 1.0
    y_event = sampled_acceptance(frame["accept_prob"].to_numpy(), int(ecfg.seed))
    scores = predictor_scores(cfg, records, rows, verifiers, table)
    metrics = score_metrics(scores, y_label, y_event, ecfg)
    notes = []
    if table is None:
        metrics["auc"]["sv_table"] = None
        notes.append(
            "sv_table: the records have no S and A (harvested without a companion), so there is "
            "no SV table to score"
        )
    information_detail, info_gain = ({}, None)
    if table is not None:
        information_detail, info_gain = information_report(records, table, rows)
    # the theorem's u is the same draw as the sampled accept event's
    u = np.random.default_rng(int(ecfg.seed)).random(len(rows))
    theorems = {
        name: theorem_checks(frame, scores[name], float(ecfg.tau), u, list(ecfg.theorem_mixes))
        for name in verifiers
    }
    out_dir = Path(cfg.experiment_dir) / "eval"
    learning = summarise_learning(
        {n: c.meta.get("metrics", {}).get("learning_curve") for n, c in verifiers.items()},
        float(ecfg.target_auc),
    )
    plots = make_plots(out_dir, metrics, verifiers, table, frame)
    if learning:
        plots.append(
            plot_learning_curves(learning, out_dir / "auc_vs_records.png", float(ecfg.target_auc))
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
        "auc_sampled": metrics["auc_sampled"],
        "calibration": metrics["calibration"],
        "eta": metrics["eta"],
        "info_gain_bits": info_gain,
        "information": information_detail,
        **entropy_table(frame, y_event, y_label),
        "theorem_checks": theorems,
        "learning_curve": learning,
        "ceiling": ceiling_report(cfg, records),
        "target_auc": float(ecfg.target_auc),
        "transfer": transfer_report(cfg, verifiers),
        "predictors": {
            **{n: f"SPRINTER verifier trained at λ={c.lam:g}" for n, c in verifiers.items()},
            "sv_table": "SV P(accept | S, A), default binning of tables/sv_table.json",
            "svip_entropy": f"SVIP 1 - sqrt({ecfg.svip_c} H_q)",
            "adaedl_bound": f"AdaEDL 1 - sqrt({ecfg.adaedl_gamma} H_q)",
            "draft_q": "q(x), the draft's probability of its token",
        },
        "inputs": {
            "records": {"dir": str(records.records_dir), "manifest_sha256": records.manifest_hash},
            "verifiers": {
                n: {
                    "path": str(c.path),
                    "sha256": file_sha256(c.path)[:16],
                    "trained_on_this_record_set": c.meta["records"].get("content_id")
                    == records.content_id,
                }
                for n, c in verifiers.items()
            },
            "sv_table": None
            if table is None
            else {
                "path": str(Path(cfg.experiment_dir) / "tables" / "sv_table.json"),
                "binning": table.binning.name,
                "records_manifest_sha256": table.meta["records"]["manifest_sha256"],
                "fitted_on_this_record_set": table.meta["records"].get("content_id")
                == records.content_id,
            },
        },
        "roc": metrics["roc"],
        "reliability": metrics["reliability"],
        "plots": [str(p.relative_to(out_dir)) for p in plots],
        "notes": notes,
        "config": OmegaConf.to_container(ecfg, resolve=True),
        "code_version": code_version(),
    }
    for name, meta in report["inputs"]["verifiers"].items():
        if not meta["trained_on_this_record_set"]:
            notes.append(f"{name} was trained on another record set: rerun stage=train")
    if table is not None and not report["inputs"]["sv_table"]["fitted_on_this_record_set"]:
        notes.append("the SV table was fitted on another record set: rerun stage=tables")
    report = finite(report)
    write_json(out_dir / "report.json", report)
    (out_dir / "report.md").write_text(render_markdown(report))
    log.info("evaluate: AUC against q/p <= 1: %s", report["auc"])
    return {
        "report": str(out_dir / "report.json"),
        "rows": len(rows),
        "auc": report["auc"],
        "info_gain_bits": report["info_gain_bits"],
        "entropy_accepted": report["entropy_accepted"],
        "entropy_rejected": report["entropy_rejected"],
    }


def make_plots(
    out_dir: Path,
    metrics: dict[str, Any],
    verifiers: dict[str, VerifierCheckpoint],
    table: SVTable | None,
    frame,
) -> list[Path]:
    def curves(names, key="roc", auc_key="auc"):
        return {n: {**metrics[key][n], "auc": metrics[auc_key][n]} for n in names}

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
    return plots
