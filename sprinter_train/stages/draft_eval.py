"""stage=draft_eval: how good is the draft for speculative decoding on this machine?

python -m sprinter_train stage=draft_eval experiment=<name> [models=...]

Reports alpha (mean sum_x min(p, q)) on held-out assistant replies (draft_eval.source and
split: ShareGPT's test split by default), greedy agreement, the latency ratio c, the cost of
verifying gamma + 1 tokens, and the implied SD speedup; and the draft step's floor (a bare
matmul chain over its weights) beside its model-only and engine steps (bench/timing/step_floor.py).
draft_eval.extra_sources are scored beside the main source (`by_source`): HumanEval problems,
or the target's own sampled replies to held-out ShareGPT turns (target_replies). The
exchanges are bench/draft/exchanges.py's, the measurements bench/draft/evaluate.py's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from sprinter_train.bench.draft.evaluate import (
    implied_speedups,
    measure_latency,
    measure_sources,
    sampling_settings,
    step_floor,
)
from sprinter_train.bench.draft.exchanges import check_sources, exchange_shape
from sprinter_train.bench.draft.report import (
    format_table,
    headline,
    targets_met,
    update_model_card,
)
from sprinter_train.bench.run import provenance
from sprinter_train.core.io import write_json
from sprinter_train.core.runtime import resolve_device, resolve_dtype, set_threads
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.models.loading import resolve_path
from sprinter_train.models.roles import load_roles

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> dict[str, Any]:
    ecfg = cfg.draft_eval
    sources = check_sources(ecfg)
    exchange_shape(ecfg)
    set_threads(cfg.get("num_threads"))
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    started = provenance.start(cfg, device, dtype)
    models = load_roles(cfg.models, device, dtype, companion=False)
    target, draft = models.target, models.draft

    default = SamplingConfig.from_cfg(cfg.sampling)
    settings = sampling_settings(default, ecfg.temperatures)
    by_source = measure_sources(sources, draft, target, ecfg, cfg, settings, device)
    quality = by_source[sources[0]]
    gammas = [int(g) for g in ecfg.gammas]
    latency = measure_latency(
        draft.model, target.model, gammas, ecfg.latency_reps, ecfg.context_tokens, device
    )
    floor = step_floor(draft, target, default, ecfg, cfg.decoding)
    alpha = quality["alpha"]
    speedup = implied_speedups(alpha, latency, gammas)
    best = max(speedup, key=speedup.get)
    targets = OmegaConf.to_container(ecfg.get("targets") or {})
    result = {
        "draft": draft.name,
        "target": target.name,
        "sampling": OmegaConf.to_container(cfg.sampling),
        "alpha": alpha,
        "alpha_by_setting": quality["alpha_by_setting"],
        "greedy_agreement": quality["greedy_agreement"],
        "positions": quality["positions"],
        "sequences": quality["sequences"],
        "by_source": by_source,
        **latency,
        "implied_speedup": speedup,
        "best_gamma": best,
        "targets": targets,
        "targets_met": targets_met(targets, headline(alpha, latency["c"], speedup[best])),
        "step_floor": floor,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "provenance": provenance.finish(
            started, models=provenance.model_hashes({"target": target, "draft": draft})
        ),
    }
    out = Path(cfg.experiment_dir) / "draft_eval.json"
    write_json(out, result)
    print(format_table(result))
    if ecfg.get("update_model_card"):
        card = Path(resolve_path(str(cfg.models.draft.path))) / "README.md"
        update_model_card(card, result, cfg)
    log.info("wrote %s", out)
    return result
