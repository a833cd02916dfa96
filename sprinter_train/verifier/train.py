"""Train one verifier (one label: q/p <= λ, or the soft min(1, p/q)) and export it with its
sidecar: the fit (fit.py), its learning curve when asked for, and what the sidecar records
of the features, the records, the prompts it was fitted on and the metrics."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sprinter_train.data.overlap import FIT_SPLITS, fitted_prompts
from sprinter_train.harvest.manifest import code_version
from sprinter_train.harvest.reader import RecordSet
from sprinter_train.verifier.checkpoint import MLPVerifier, save_verifier, verifier_path
from sprinter_train.verifier.embedder import make_embedder
from sprinter_train.verifier.evidence import check_evidence
from sprinter_train.verifier.features import FeatureSpec
from sprinter_train.verifier.fit import fit_verifier, selecting
from sprinter_train.verifier.labels import Label
from sprinter_train.verifier.learning_curve import learning_curve
from sprinter_train.verifier.split_metrics import class_balance

log = logging.getLogger(__name__)


def fitted_prompts_of(records: RecordSet, splits: tuple[str, ...]) -> dict[str, Any] | None:
    """The digests of the prompt ids of `splits` (data.overlap): the bench refuses to time a
    predictor on them. None when the frame has no prompt_id column."""
    if "prompt_id" not in records.frame:
        return None
    chosen = records.frame["split"].isin(splits).to_numpy()
    return fitted_prompts(records.frame["prompt_id"][chosen].astype(str).unique(), splits)


LABEL_NOTES = {
    "ratio": "1 if q/p <= lam (SPRINTER §3.2)",
    "accept_prob": "soft target min(1, p/q) with BCE (SpecDec++): no λ, train.lam and "
    "train.lams are not used",
}


def train_verifier(cfg: DictConfig, records: RecordSet, label: Label | float) -> dict[str, Any]:
    """Train, restore the best epoch, fit the temperature, export `verifier-lam<λ>` (a number
    is the ratio label at that λ) or `verifier-accept`, and return its metrics (with the
    learning curve of `train.learning_curve` when it lists fractions)."""
    label = Label.of(label)
    tcfg = cfg.train
    spec = FeatureSpec.from_cfg(tcfg)
    check_evidence(records, label, selecting(tcfg))  # before any fit: both classes to learn
    embedder = make_embedder(cfg, spec, records)
    name = label.name + ("" if str(tcfg.get("head", "linear")) == "linear" else "-mlp")
    log_dir = Path(cfg.experiment_dir) / "train"
    verifier, metrics, layout, calibration, selection = fit_verifier(
        cfg, records, label, spec, embedder, name
    )
    fit_seconds = metrics["fit_seconds"]
    d_in = sum(block["width"] for block in layout)
    head = str(tcfg.get("head", "linear"))
    extra = None
    if isinstance(verifier, MLPVerifier):
        tensors = verifier.tensors()
        weight, bias = tensors.pop("weight"), tensors.pop("bias")
        extra = tensors
    else:
        weight, bias = verifier.linear.weight.detach()[0], verifier.linear.bias.detach()
    fractions = [float(f) for f in tcfg.get("learning_curve") or []]
    if fractions:
        metrics["learning_curve"] = learning_curve(
            cfg, records, label, spec, embedder, fractions, metrics
        )
    balance = class_balance(records, label)
    draft = records.manifest.get("models", {}).get("draft", {})
    meta = {
        "stage": "train",
        "experiment": str(cfg.experiment),
        "label": label.kind,
        "label_note": LABEL_NOTES[label.kind],
        "lam": label.lam,
        **({} if head == "linear" else {"head": head, "mlp": {"hidden": int(weight.shape[0])}}),
        "calibration": calibration,
        "selection": selection,
        "features": {
            "names": list(spec.names),
            "layout": layout,
            "d_in": d_in,
            "settings": spec.describe(),
        },
        "standardisation": "folded into weight and bias: apply to raw features",
        "hidden_layer": records.manifest["hidden"]["layer"],
        "d": records.d,
        "draft_model": draft.get("id"),
        "draft_identity": draft or None,  # the harvest's model_identity: all of it is compared
        "fitted_prompts": fitted_prompts_of(records, FIT_SPLITS),
        "records": {
            "dir": str(records.records_dir),
            "manifest_sha256": records.manifest_hash,
            "content_id": records.content_id,
            "fingerprint": records.manifest.get("fingerprint"),
        },
        "sampling": records.manifest.get("sampling"),
        "class_balance": balance,
        "metrics": metrics,
        "train_config": OmegaConf.to_container(tcfg, resolve=True),
        "code_version": code_version(),
        "logs": str(log_dir / name),
    }
    path = save_verifier(verifier_path(cfg.checkpoint_dir, label, head), weight, bias, meta, extra)
    val = metrics["val"] or {}
    log.info(
        "verifier %s (%s): val AUC (q/p<=1) %s, BCE %.4f, T %.3f (val NLL %.4f -> %.4f), "
        "%d epochs, %.1f s -> %s",
        name,
        label.describe(),
        val.get("auc_q_le_p"),
        val.get("bce", float("nan")),
        calibration["temperature"],
        calibration["nll_before"],
        calibration["nll_after"],
        metrics["epochs_run"],
        fit_seconds,
        path,
    )
    return {
        "checkpoint": str(path),
        "label": label.kind,
        "lam": label.lam,
        "calibration": calibration,
        "selection": selection,
        "class_balance": balance,
        **metrics,
    }
