"""Fit one verifier under a Lightning Trainer, early-stopped on the val loss: the best
epoch's head with its standardisation folded in, train.select's choice when it runs, the
temperature fitted on val and the split metrics."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, NamedTuple

import pytorch_lightning as pl
from omegaconf import DictConfig
from pytorch_lightning.callbacks import EarlyStopping

from sprinter_train.core.runtime import resolve_device
from sprinter_train.harvest.reader import RecordSet
from sprinter_train.verifier.calibration import fit_temperature
from sprinter_train.verifier.checkpoint import LinearVerifier, MLPVerifier
from sprinter_train.verifier.data import VerifierDataModule, split_targets
from sprinter_train.verifier.features import DraftEmbedder, FeatureSpec
from sprinter_train.verifier.head_selection import select_head
from sprinter_train.verifier.labels import Label
from sprinter_train.verifier.lightning_setup import make_loggers, make_strategy
from sprinter_train.verifier.module import KeepBest, VerifierModule
from sprinter_train.verifier.split_metrics import split_logits, split_metrics


class Fit(NamedTuple):
    verifier: LinearVerifier | MLPVerifier
    metrics: dict[str, Any]
    layout: list[dict[str, Any]]
    calibration: dict[str, Any]
    selection: dict[str, Any] | None = None


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
