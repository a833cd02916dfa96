"""What draft_eval measures: alpha and greedy agreement per source, step latencies, the floor.

alpha is mean sum_x min(p, q) at every reply position, teacher-forced, under each sampling
setting; the latency ratio c and the cost of verifying gamma + 1 tokens give the implied SD
speedup; the draft step is set against its floor (bench/timing/step_floor.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from sprinter_train.bench.draft.exchanges import source_exchanges, source_split
from sprinter_train.bench.timing.latency import profile_models
from sprinter_train.bench.timing.step_floor import measure_step_floor
from sprinter_train.core.distributions import acceptance_alpha, implied_speedup
from sprinter_train.core.sampling import SamplingConfig, warp_probs
from sprinter_train.models.loading import LoadedModel

log = logging.getLogger(__name__)


def measure_sources(
    sources: list[str],
    draft: LoadedModel,
    target: LoadedModel,
    ecfg: Mapping[str, Any],
    cfg: DictConfig,
    settings: dict[str, SamplingConfig],
    device: torch.device,
) -> dict[str, dict[str, Any]]:
    """alpha per setting, greedy agreement and counts of every source, in the order given."""
    by_source: dict[str, dict[str, Any]] = {}
    for source in sources:
        started = time.perf_counter()
        exchanges = source_exchanges(source, target, ecfg, cfg)
        if not exchanges:
            raise ValueError(
                f"draft_eval.source {source!r} gave no exchange with >= "
                f"{ecfg['min_reply_tokens']} reply tokens in {ecfg['seq_len']} tokens"
            )
        quality = measure_alpha(draft.model, target.model, exchanges, settings, device)
        by_source[source] = {
            "split": source_split(source, ecfg),
            "alpha": quality["alpha"]["default"],
            "alpha_by_setting": quality["alpha"],
            "greedy_agreement": quality["greedy_agreement"],
            "positions": quality["positions"],
            "sequences": len(exchanges),
            "seconds": time.perf_counter() - started,
        }
        log.info("draft_eval %s: %s", source, by_source[source])
    return by_source


@torch.no_grad()
def measure_alpha(
    draft, target, exchanges, settings: dict[str, SamplingConfig], device
) -> dict[str, Any]:
    """Teacher-forced alpha and greedy agreement at every assistant position."""
    sums = {name: 0.0 for name in settings}
    agree, count = 0.0, 0
    for ids, start in exchanges:
        x = torch.tensor([ids], device=device)
        # logits at position t-1 predict token t: assistant tokens are start..len-1
        p_logits = target(input_ids=x).logits[0, start - 1 : -1].float()
        q_logits = draft(input_ids=x).logits[0, start - 1 : -1].float()
        for name, sampling in settings.items():
            sums[name] += float(
                acceptance_alpha(
                    warp_probs(p_logits, sampling), warp_probs(q_logits, sampling)
                ).sum()
            )
        agree += float((p_logits.argmax(-1) == q_logits.argmax(-1)).sum())
        count += p_logits.shape[0]
    return {
        "alpha": {k: v / count for k, v in sums.items()},
        "greedy_agreement": agree / count,
        "positions": count,
    }


@torch.no_grad()
def measure_latency(
    draft, target, gammas: list[int], reps: int, context: int, device
) -> dict[str, Any]:
    """Median KV-cached step times (interleaved rounds) and the ratios SD's speedup needs."""
    profile = profile_models(target, draft, None, max(gammas), reps, context, device)
    sizes = sorted({1, *[g + 1 for g in gammas]})
    return {
        "draft_step_ms": profile.draft_ms,
        "target_step_ms": profile.target_ms[1],
        "target_forward_ms": {n: profile.target_ms[n] for n in sizes},
        "c": profile.c,
        "verify_cost": {g: profile.verify_cost(g) for g in gammas},
    }


def sampling_settings(default: SamplingConfig, temperatures: Any) -> dict[str, SamplingConfig]:
    """The run's own sampling ('default'), then plain sampling at each temperature."""
    plain = {f"T={t:g}": SamplingConfig(temperature=float(t)) for t in temperatures}
    return {"default": default, **plain}


def implied_speedups(alpha: float, latency: dict[str, Any], gammas: list[int]) -> dict[int, float]:
    """SD's expected speedup at each gamma from alpha, c and the verify costs measured."""
    return {g: implied_speedup(alpha, g, latency["c"], latency["verify_cost"][g]) for g in gammas}


def step_floor(
    draft: LoadedModel,
    target: LoadedModel,
    sampling: SamplingConfig,
    ecfg: Mapping[str, Any],
    decoding: Mapping[str, Any],
) -> dict[str, Any]:
    """The draft step against its floor, with `step_targets` and whether each is met (all
    are costs: lower is better); `decoding`: the config's decoding section, whose
    `pack_every` and `prefill_tokens` the engine step takes."""
    floor = measure_step_floor(
        draft.model,
        target.model,
        sampling,
        int(ecfg["context_tokens"]),
        int(ecfg["floor_reps"]),
        decoding=decoding,
    ).report()
    goals = OmegaConf.to_container(ecfg.get("step_targets") or {})
    floor["targets"] = goals
    floor["targets_met"] = {name: floor[name] <= goal for name, goal in goals.items()}
    return floor
