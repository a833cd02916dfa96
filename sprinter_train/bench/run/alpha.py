"""The draft's acceptance rate alpha the bench seeds sd's gamma and the learned priors with:
the experiment's records when they were measured with the bench's sampling and models, else
sd's acceptance on the warm-up prompt."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from omegaconf import DictConfig

from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.batch import DecodeStats
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import SpeculativeDecoding
from sprinter_train.harvest.reader import open_records, verify_hashes
from sprinter_train.models.identity import roles_differences

log = logging.getLogger(__name__)


def estimate_alpha(
    engine: Engine,
    prompt: Prompt,
    cfg: DictConfig,
    identities: dict[str, dict[str, Any]] | None = None,
) -> tuple[float, str]:
    """The draft's acceptance rate alpha and where it came from: the mean beta = sum min(p, q)
    of the experiment's records when there are any (thousands of positions) and they were
    measured with the bench's sampling and models (`identities`: role -> model_identity),
    else SD's acceptance on the warm-up prompt (noisy: one prompt)."""
    note = ""
    try:
        records = open_records(
            cfg.experiment_dir, columns=["beta"], stage="stage=bench", verify=verify_hashes(cfg)
        )
        measured = records.manifest.get("sampling")
        bench = asdict(SamplingConfig.from_cfg(cfg.sampling))
        recorded = records.manifest.get("models") or {}
        ours = {r: i for r, i in (identities or {}).items() if recorded.get(r) is not None}
        other = roles_differences(recorded, ours)
        if measured is not None and measured != bench:
            # beta depends on the warping: records of other sampling would pick a wrong gamma
            note = f" (records refused: measured under sampling {measured}, the bench's {bench})"
            log.warning("bench: alpha not taken from the records%s", note)
        elif other:  # another draft's beta seeds sd's gamma and the learned priors wrongly
            note = f" (records refused: harvested with another model: {'; '.join(other)})"
            log.warning("bench: alpha not taken from the records%s", note)
        elif len(records.frame):
            return float(records.frame["beta"].mean()), f"records ({len(records.frame)} rows)"
    except FileNotFoundError:
        pass
    stats = DecodeStats()
    for run in range(max(1, int(cfg.bench.warmup_runs))):
        policy = SpeculativeDecoding(max(1, int(cfg.bench.gamma_max) // 2))
        result = engine.generate([prompt.input_ids], policy, int(cfg.bench.max_new_tokens), [run])
        stats.add(result[0].stats)
    return stats.accepted / max(stats.drafted, 1), "sd on the warm-up prompt" + note
