"""stage=harvest: per-token records for verifier training, over SPRINTER's four prefix mixes.

python -m sprinter_train stage=harvest experiment=<name> [data.num_prompts=N] [harvest.*=...]

Writes artifacts/<name>/records/: Parquet shards, aligned float16 draft hidden states, the
sequences they came from and manifest.json (see sprinter_train/harvest/schema.py). Re-running
the same command resumes; harvest.devices=N harvest.strategy=ddp runs N processes. One harvest
at a time per experiment: a second one fails at once naming the holder of <experiment>/harvest.lock.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sprinter_train.core import pidlock
from sprinter_train.harvest.driver import harvest
from sprinter_train.models.loading import looks_local, resolve_path
from sprinter_train.stages.model_settings import check_model_settings

PRODUCERS = {
    "draft": "python -m sprinter_train stage=distill",
    "companion": "python -m sprinter_train stage=distill distill=companion",
}


def check_inputs(cfg: DictConfig) -> None:
    """Fail at once, naming the missing model and the stage that makes it."""
    specs: dict[str, Any] = OmegaConf.to_container(cfg.models, resolve=True)  # type: ignore[assignment]
    for role in ("target", "draft", "companion"):
        spec = specs.get(role)
        if not spec:
            if role != "companion":
                raise ValueError(f"stage=harvest needs models.{role}")
            continue
        path = str(spec.get("path") or "")
        if path == "tiny_random" or path.startswith("pkg://"):
            continue  # built in code, or checked by the loader with an install hint
        resolved = Path(resolve_path(path))
        if looks_local(path) and not resolved.exists():
            how = PRODUCERS.get(role, "a model download")
            raise FileNotFoundError(
                f"stage=harvest needs the {role} model at {path} ({resolved}), which does not "
                f"exist: make it with `{how}` or set models.{role}.path to an existing model"
            )


def run(cfg: DictConfig) -> dict[str, Any]:
    check_inputs(cfg)
    check_model_settings(cfg, "harvest")  # before a model loads or a shard is redone
    with pidlock.experiment_writer(cfg.experiment_dir, "harvest"):
        return harvest(cfg)
