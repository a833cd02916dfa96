"""Fit one verifier (one label: q/p <= λ, or the soft min(1, p/q)) under a Lightning Trainer,
fit its temperature on the val split, and export it with its sidecar."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import EarlyStopping
from pytorch_lightning.loggers import CSVLogger, Logger
from pytorch_lightning.strategies import DDPStrategy

from sprinter_train.core.classification import auc
from sprinter_train.core.runtime import resolve_device
from sprinter_train.data.overlap import FIT_SPLITS, fitted_prompts
from sprinter_train.harvest.manifest import code_version
from sprinter_train.harvest.reader import RecordSet
from sprinter_train.models.loading import describe_spec
from sprinter_train.verifier.calibration import fit_temperature
from sprinter_train.verifier.checkpoint import (
    LinearVerifier,
    MLPVerifier,
    VerifierCheckpoint,
    save_verifier,
    verifier_path,
)
from sprinter_train.verifier.data import VerifierDataModule, split_features, split_targets
from sprinter_train.verifier.evidence import check_evidence
from sprinter_train.verifier.features import DraftEmbedder, FeatureSpec
from sprinter_train.verifier.labels import Label, labels_at
from sprinter_train.verifier.module import KeepBest, VerifierModule
from sprinter_train.verifier.select import Candidate, choose, fit_family, load_splits, scored

log = logging.getLogger(__name__)


def make_embedder(cfg: DictConfig, spec: FeatureSpec, records: RecordSet) -> DraftEmbedder | None:
    """The draft's token embedding, only when asked for; it must be the harvest's draft."""
    if "embedding" not in spec.widths:
        return None
    draft: dict[str, Any] = OmegaConf.to_container(cfg.models.draft, resolve=True)  # type: ignore[assignment]
    harvested = records.manifest.get("models", {}).get("draft", {}).get("id")
    if harvested and harvested != describe_spec(draft):
        raise ValueError(
            f"the token_embedding feature needs the harvest's draft {harvested}, but "
            f"models.draft is {describe_spec(draft)}"
        )
    return DraftEmbedder(draft, cfg.models.get("cache_dir"))


def make_strategy(tcfg: DictConfig, accelerator: str) -> Any:
    """Single process unless train.devices > 1 or train.strategy=ddp (spawned processes)."""
    if tcfg.strategy not in ("auto", "ddp"):
        raise ValueError(f"train.strategy must be auto or ddp, got {tcfg.strategy!r}")
    if tcfg.strategy == "ddp" or tcfg.devices != 1 or int(tcfg.num_nodes) > 1:
        return DDPStrategy(
            start_method=tcfg.start_method,
            process_group_backend="gloo" if accelerator == "cpu" else None,
        )
    return "auto"


def make_loggers(cfg: DictConfig, save_dir: Path, name: str) -> list[Logger]:
    """CSV always; wandb (offline unless logger.wandb.mode says otherwise) when enabled."""
    loggers: list[Logger] = [CSVLogger(save_dir=str(save_dir), name=name, version="")]
    wcfg = cfg.logger.get("wandb") or {}
    if wcfg.get("enabled"):
        from pytorch_lightning.loggers import WandbLogger

        loggers.append(
            WandbLogger(
                project=wcfg.get("project", "sprinter_train"),
                name=f"{cfg.experiment}-{name}",
                save_dir=str(save_dir),
                offline=wcfg.get("mode", "offline") == "offline",
            )
        )
    return loggers


def class_balance(records: RecordSet, label: Label) -> dict[str, Any]:
    """The label's base rate per split: the fraction with q/p <= λ, or the mean min(1, p/q)."""
    values = records.frame[label.column].to_numpy()
    split = records.frame["split"].to_numpy()
    key = "positive_fraction" if label.kind == "ratio" else "mean_accept_prob"
    out: dict[str, Any] = {}
    for name in ("train", "val", "test"):
        targets = label.targets(values[split == name])
        out[name] = {
            "rows": int(len(targets)),
            key: float(targets.mean()) if len(targets) else None,
        }
    return out


SplitLogits = dict[str, tuple[torch.Tensor, np.ndarray]]


def split_logits(
    verifier: VerifierCheckpoint | LinearVerifier | MLPVerifier,
    records: RecordSet,
    spec: FeatureSpec,
    embedder: DraftEmbedder | None,
) -> SplitLogits:
    """(logits w·s + b, global rows) of the val and test splits; a split without rows is left
    out."""
    model = verifier.model if isinstance(verifier, VerifierCheckpoint) else verifier
    out: SplitLogits = {}
    for split in ("val", "test"):
        features, rows = split_features(records, split, spec, embedder)
        if len(rows):
            with torch.no_grad():
                out[split] = (model.logits(features.batch()), rows)
    return out


def split_metrics(
    logits: SplitLogits, records: RecordSet, label: Label, temperature: float = 1.0
) -> dict[str, Any]:
    """Per split: BCE against the training label, raw and at temperature T; AUC against
    q/p <= 1 and, for a ratio label, against q/p <= λ; for the soft label, the mean target
    and the mean calibrated score (do they agree on average?)."""
    ratio_all = records.frame["ratio"].to_numpy()
    out: dict[str, Any] = {}
    for split in ("val", "test"):
        if split not in logits:
            out[split] = None
            continue
        z, rows = logits[split]
        y = torch.from_numpy(split_targets(records, rows, label))
        score = torch.sigmoid(z).numpy()
        entry: dict[str, Any] = {
            "rows": int(len(rows)),
            "bce": float(torch.nn.functional.binary_cross_entropy_with_logits(z, y)),
        }
        if label.kind == "ratio":
            entry["auc_label_lam"] = auc(y.numpy(), score)
        entry["auc_q_le_p"] = auc(labels_at(ratio_all[rows], 1.0), score)
        entry["bce_calibrated"] = float(
            torch.nn.functional.binary_cross_entropy_with_logits(z / temperature, y)
        )
        if label.kind == "accept_prob":
            entry["mean_label"] = float(y.mean())
            entry["mean_score_calibrated"] = float(torch.sigmoid(z / temperature).mean())
        out[split] = entry
    return out


class Fit(NamedTuple):
    verifier: LinearVerifier | MLPVerifier
    metrics: dict[str, Any]
    layout: list[dict[str, Any]]
    calibration: dict[str, Any]
    selection: dict[str, Any] | None = None


def select_head(
    cfg: DictConfig,
    records: RecordSet,
    label: Label,
    spec: FeatureSpec,
    embedder: DraftEmbedder | None,
    layout: list[dict[str, Any]],
    trained: LinearVerifier,
    trained_seconds: float = 0.0,
) -> tuple[LinearVerifier, dict[str, Any]]:
    """train.select (verifier/select.py): the Lightning head (`full`) beside the scalar-only
    and the ridge heads, the one with the best val AUC kept (ties to the simpler); returns it
    as a LinearVerifier on raw features and what the sidecar records of the choice."""
    scfg = cfg.train.select
    start = time.perf_counter()
    cap = scfg.get("max_train_rows")
    splits = load_splits(
        records,
        spec,
        label,
        embedder,
        layout,
        None if cap is None else int(cap),
        int(cfg.train.seed),
    )
    candidates, _ = fit_family(
        splits,
        [float(v) for v in scfg.l2_grid],
        float(scfg.l2_scalars),
        int(scfg.get("max_iter", 500)),
    )
    raw_w = trained.linear.weight.detach()[0].float()
    raw_b = trained.linear.bias.detach().float()
    # the trained head in the standardised space the others were scored in
    w_std, b_std = raw_w * splits.scale, raw_b + (raw_w * splits.mean).sum()
    full = Candidate("full", w_std, b_std, seconds=trained_seconds)
    candidates.append(scored(splits, full, w_std, b_std))
    winner = choose(candidates, float(scfg.tie))
    chosen = LinearVerifier(int(raw_w.numel()))
    chosen.linear.weight.data.copy_(winner.weight[None])
    chosen.linear.bias.data.copy_(winner.bias)
    selection = {
        "chosen": winner.name,
        "metric": "val AUC against q/p <= 1",
        "tie": float(scfg.tie),
        "candidates": {c.name: c.describe() for c in candidates},
        "train_rows": int(len(splits.y_train)),
        "seconds": time.perf_counter() - start,
        "note": "scalars: the scalar features alone (dense weights 0); ridge: L2 on the dense "
        "blocks chosen on val; full: the Lightning head. All on standardised inputs, folded.",
    }
    log.info(
        "train.select: %s kept (val AUC %s)",
        winner.name,
        {c.name: None if c.val_auc is None else round(c.val_auc, 4) for c in candidates},
    )
    return chosen, selection


def fit_verifier(
    cfg: DictConfig,
    records: RecordSet,
    label: Label,
    spec: FeatureSpec,
    embedder: DraftEmbedder | None,
    name: str,
) -> Fit:
    """Fit on the train split under a Lightning Trainer, early-stopped on the val loss; return
    the best epoch's verifier (standardisation folded in), its metrics, layout and the
    temperature fitted on the val split (after training: the weights do not depend on it)."""
    tcfg = cfg.train
    start = time.perf_counter()
    pl.seed_everything(int(tcfg.seed), workers=False, verbose=False)
    datamodule = VerifierDataModule(
        records,
        spec,
        label,
        int(tcfg.batch_size),
        int(tcfg.seed),
        embedder,
        int(tcfg.min_batches_per_epoch),
    )
    target_d = records.target_d if "target_hidden" in spec.widths else None
    layout = spec.layout(records.d, embedder.dim if embedder else None, target_d)
    d_in = sum(block["width"] for block in layout)
    head = str(tcfg.get("head", "linear"))
    mlp = tcfg.get("mlp") or {}
    module = VerifierModule(
        d_in,
        lr=float(tcfg.lr if head == "linear" else mlp["lr"]),
        weight_decay=float(tcfg.weight_decay if head == "linear" else mlp["weight_decay"]),
        plateau_factor=float(tcfg.plateau_factor),
        plateau_patience=int(tcfg.plateau_patience),
        head=head,
        mlp_hidden=int(mlp.get("hidden", 256)),
        mlp_dropout=float(mlp.get("dropout", 0.0)),
    )
    accelerator = resolve_device(cfg.device).type
    log_dir = Path(cfg.experiment_dir) / "train"
    loggers = make_loggers(cfg, log_dir, name)
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=tcfg.devices,
        num_nodes=int(tcfg.num_nodes),
        strategy=make_strategy(tcfg, accelerator),
        max_epochs=int(tcfg.max_epochs),
        callbacks=[
            EarlyStopping("val_loss", patience=int(tcfg.patience), min_delta=float(tcfg.min_delta)),
            KeepBest(),
        ],
        logger=loggers,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=bool(tcfg.progress_bar),
        num_sanity_val_steps=0,
        use_distributed_sampler=False,
        log_every_n_steps=int(tcfg.log_every_n_steps),
        default_root_dir=str(log_dir),
    )
    try:
        trainer.fit(module, datamodule=datamodule)
    finally:
        if len(loggers) > 1:  # wandb: close the run even when training failed
            import wandb

            wandb.finish()
    fit_seconds = time.perf_counter() - start
    verifier: LinearVerifier | MLPVerifier
    selection = None
    if head == "linear":
        weight, bias = module.folded()
        verifier = LinearVerifier(d_in)
        verifier.linear.weight.data.copy_(weight[None])
        verifier.linear.bias.data.copy_(bias)
        if selecting(tcfg):
            verifier, selection = select_head(
                cfg, records, label, spec, embedder, layout, verifier, fit_seconds
            )
            fit_seconds = time.perf_counter() - start
    else:
        verifier = MLPVerifier.of(module.folded_mlp())
    logits = split_logits(verifier.eval(), records, spec, embedder)
    val_logits, val_rows = logits["val"]  # the data module refused a split without val rows
    calibration = fit_temperature(
        val_logits.numpy(), split_targets(records, val_rows, label), fitted_on="val"
    )
    metrics = {
        "best_val_loss": float(module.best_val_loss),
        "best_epoch": int(module.best_epoch),
        "epochs_run": int(module.epochs_run),
        "fit_seconds": fit_seconds,
        "world_size": trainer.world_size,
        "train_rows": int(len(records.rows_of("train"))),
        **split_metrics(logits, records, label, calibration["temperature"]),
    }
    if selection is not None:
        metrics["selected"] = selection["chosen"]
    return Fit(verifier, metrics, layout, calibration, selection)


def selecting(tcfg: DictConfig) -> bool:
    """Whether train.select runs: on unless disabled (the paper's configuration) or the head
    is the MLP (its family would be MLPs, not linear heads)."""
    scfg = tcfg.get("select") or {}
    return bool(scfg.get("enabled", False)) and str(tcfg.get("head", "linear")) == "linear"


def learning_curve(
    cfg: DictConfig,
    records: RecordSet,
    label: Label,
    spec: FeatureSpec,
    embedder: DraftEmbedder | None,
    fractions: list[float],
    full: dict[str, Any],
) -> list[dict[str, Any]]:
    """Val/test AUC of verifiers fitted on nested fractions of the train prompts (the same
    val and test rows): whether more records would still raise the AUC, measured."""
    points = []
    for fraction in sorted(f for f in fractions if 0 < f < 1):
        subset = records.with_train_prompts(fraction, int(cfg.train.seed))
        if len(subset.rows_of("train")) == 0:
            continue
        name = f"{label.name}/curve-{fraction:g}"
        fit = fit_verifier(cfg, subset, label, spec, embedder, name)
        points.append(curve_point(fraction, subset, fit.metrics))
    points.append(curve_point(1.0, records, full))
    return points


def curve_point(fraction: float, records: RecordSet, metrics: dict[str, Any]) -> dict[str, Any]:
    train = records.rows_of("train")
    return {
        "fraction": fraction,
        "train_rows": int(len(train)),
        "train_prompts": int(records.frame["prompt_id"].iloc[train].nunique())
        if "prompt_id" in records.frame
        else None,
        "val_auc_q_le_p": (metrics.get("val") or {}).get("auc_q_le_p"),
        "test_auc_q_le_p": (metrics.get("test") or {}).get("auc_q_le_p"),
        "epochs_run": metrics["epochs_run"],
        "fit_seconds": metrics["fit_seconds"],
        "selected": metrics.get("selected"),
    }


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
