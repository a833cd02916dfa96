"""stage=train: SPRINTER verifiers (Linear(d, 1) + sigmoid on the draft hidden state), one per λ,
or the one soft-label verifier (train.label=accept_prob); each with a temperature fitted on
the val split.

python -m sprinter_train stage=train experiment=<exp>                      # every λ in train.lams
python -m sprinter_train -m stage=train experiment=<exp> train.lam=1,1.2,1.5  # Hydra multirun
python -m sprinter_train stage=train experiment=<exp> train.label=accept_prob  # min(1, p/q)

Reads artifacts/<exp>/records/ (stage=harvest); writes
checkpoints/<exp>/verifier-lam<λ>.safetensors + .json (verifier-accept.* for accept_prob) and
CSV logs under artifacts/<exp>/train/lam<λ>/ (train/accept/).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sprinter_train.core import pidlock
from sprinter_train.core.interrupt import note_completed
from sprinter_train.core.io import write_json
from sprinter_train.core.runtime import set_threads
from sprinter_train.harvest.reader import open_records, verify_hashes
from sprinter_train.verifier.features import FeatureSpec
from sprinter_train.verifier.labels import Label, trained_lams
from sprinter_train.verifier.train import train_verifier

log = logging.getLogger(__name__)


def labels_of(cfg: DictConfig) -> list[Label]:
    """One ratio label per λ of `trained_lams`, or the single accept_prob label (which has no λ)."""
    kind = str(cfg.train.get("label") or "ratio")
    if kind == "accept_prob":
        if cfg.train.get("lam") is not None:
            log.info("train.label=accept_prob has no λ: train.lam=%s is not used", cfg.train.lam)
        return [Label("accept_prob")]
    return [Label(kind, lam) for lam in trained_lams(cfg.train)]  # Label names an unknown kind


def run(cfg: DictConfig) -> dict[str, Any]:
    with pidlock.experiment_writer(cfg.experiment_dir, "train"):
        return _run(cfg)


def _run(cfg: DictConfig) -> dict[str, Any]:
    set_threads(cfg.get("num_threads"))
    spec = FeatureSpec.from_cfg(cfg.train)
    labels = labels_of(cfg)
    label_columns = {label.column for label in labels}
    columns = sorted({"split", "ratio", "prompt_id", *label_columns, *spec.record_columns()})
    records = open_records(
        cfg.experiment_dir, columns=columns, stage="stage=train", verify=verify_hashes(cfg)
    )
    results = {}
    for label in labels:
        result = train_verifier(cfg, records, label)
        write_json(Path(cfg.experiment_dir) / "train" / label.name / "summary.json", result)
        results[f"verifier_{label.name}"] = result
        key = f"verifier {label.lam}" if label.kind == "ratio" else "verifier accept_prob"
        note_completed(key, f"verifier {label.describe()} ({result['checkpoint']})")
    return results
