"""stage=train: SPRINTER verifiers (Linear(d, 1) + sigmoid on the draft hidden state), one per λ.

python -m sprinter_train stage=train experiment=<exp>                      # every λ in train.lams
python -m sprinter_train -m stage=train experiment=<exp> train.lam=1,1.2,1.5  # Hydra multirun

Reads artifacts/<exp>/records/ (stage=harvest); writes
checkpoints/<exp>/verifier-lam<λ>.safetensors + .json and CSV logs under
artifacts/<exp>/train/lam<λ>/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sprinter_train.core.interrupt import note_completed
from sprinter_train.core.io import write_json
from sprinter_train.core.runtime import set_threads
from sprinter_train.harvest.reader import open_records, verify_hashes
from sprinter_train.verifier.checkpoint import lam_name
from sprinter_train.verifier.features import FeatureSpec
from sprinter_train.verifier.train import train_verifier


def lams_of(cfg: DictConfig) -> list[float]:
    """train.lam if set (one job of a sweep), else every λ in train.lams."""
    if cfg.train.get("lam") is not None:
        return [float(cfg.train.lam)]
    return [float(lam) for lam in cfg.train.lams]


def run(cfg: DictConfig) -> dict[str, Any]:
    set_threads(cfg.get("num_threads"))
    spec = FeatureSpec.from_names(list(cfg.train.features))
    columns = sorted({"split", "ratio", "prompt_id", *spec.record_columns()})
    records = open_records(
        cfg.experiment_dir, columns=columns, stage="stage=train", verify=verify_hashes(cfg)
    )
    results = {}
    for lam in lams_of(cfg):
        result = train_verifier(cfg, records, lam)
        write_json(
            Path(cfg.experiment_dir) / "train" / f"lam{lam_name(lam)}" / "summary.json", result
        )
        results[f"verifier_lam{lam_name(lam)}"] = result
        note_completed(f"verifier {lam}", f"verifier λ={lam_name(lam)} ({result['checkpoint']})")
    return results
