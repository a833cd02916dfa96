"""What a verifier fit's Lightning Trainer runs under: its strategy (one process, or DDP
across devices and nodes) and its loggers (CSV, and wandb when enabled)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from pytorch_lightning.loggers import CSVLogger, Logger
from pytorch_lightning.strategies import DDPStrategy


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
