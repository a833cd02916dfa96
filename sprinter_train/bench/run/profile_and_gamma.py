"""The latency profile a bench run prices rounds with, and sd's gamma chosen from it: the
profile reused from bench/latency.json when it fits (same models, kernels, device, dtype and
batch sizes, not measured under load), else measured; checked against the run's own target
forwards and measured again when they disagree; and sd's gamma per batch size."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from sprinter_train.bench.run import provenance
from sprinter_train.bench.run.provenance import cores
from sprinter_train.bench.timing.latency import LatencyProfile, profile_models
from sprinter_train.bench.timing.profile_check import ProfileCheck, check_profile
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.engine import Engine
from sprinter_train.models.identity import roles_differences
from sprinter_train.models.packed import PackedLinear
from sprinter_train.models.roles import Roles

log = logging.getLogger(__name__)


def latency_profile(
    cfg: DictConfig,
    models: Roles,
    device: torch.device,
    batch_sizes: list[int],
    engine: Engine | None = None,
    history: list[str] | None = None,
) -> LatencyProfile:
    """bench/latency.json when it was measured on this device and dtype, of these models
    (a companion's step counts: a profile without one prices it free), covers every batch
    size with 1..gamma_max + 1 tokens a row and was not measured under load (and
    `bench.latency.reuse`), else a new one. With the `engine`, the profile times its runners'
    forwards (their layout is part of what it records)."""
    path = Path(cfg.experiment_dir) / "bench" / "latency.json"
    dtype = str(next(models.target.model.parameters()).dtype).removeprefix("torch.")
    lat = cfg.bench.latency
    if lat.reuse and path.exists():
        profile = LatencyProfile.load(path)
        fits = profile.covers(batch_sizes, int(cfg.bench.gamma_max) + 1)
        differences = roles_differences(profile.models or {}, timed_models(models))
        differences += [
            f"{r}: not in this run"
            for r in set(profile.models or {}) - {m.role for m in models.all()}
        ]
        kernels = timed_kernels(models, engine)
        if profile.kernels != kernels:
            differences.append(f"kernels {profile.kernels} (now {kernels})")
        same = not differences
        if not same:
            log.info(
                "bench: re-measuring latency: %s timed other models or kernels (%s)",
                path,
                "; ".join(differences),
            )
        if same and profile.device == str(device) and profile.dtype == dtype and fits:
            if not profile.measured_under_load:
                if history is not None:
                    history.append(f"reused {path}")
                return profile
            log.warning(
                "bench: re-measuring latency: %s was measured under load %s (or records none) "
                "on %d cores",
                path,
                profile.load_average,
                cores(),
            )
    if history is not None:
        history.append("measured in this run")
    return measure_profile(cfg, models, device, batch_sizes, engine)


def measure_profile(
    cfg: DictConfig,
    models: Roles,
    device: torch.device,
    batch_sizes: list[int],
    engine: Engine | None = None,
) -> LatencyProfile:
    """A new latency profile, saved as bench/latency.json: of the `engine`'s runners when
    given (a compiled target's forward costs a fraction of the raw eager one on a GPU, so a
    profile of the raw models would misprice every round: docs/results/design-figures.md,
    "Compile on CUDA, not on a CPU"), else of the raw models."""
    lat = cfg.bench.latency
    companion = models.companion.model if models.companion is not None else None
    profile = profile_models(
        models.target.model,
        models.draft.model,
        companion,
        int(cfg.bench.gamma_max),
        int(lat.reps),
        int(lat.context_tokens),
        device,
        batch_sizes,
        runners=None if engine is None else engine.present_runners,
        warp=None if engine is None else engine.sampling,
    )
    profile.models = timed_models(models)
    profile.kernels = timed_kernels(models, engine)
    profile.save(Path(cfg.experiment_dir) / "bench" / "latency.json")
    return profile


def timed_models(models: Roles) -> dict[str, Any]:
    """What a latency profile records of the models it timed (role -> model_identity)."""
    return provenance.model_hashes({m.role: m for m in models.all()})


def timed_kernels(models: Roles, engine: Engine | None = None) -> dict[str, Any]:
    """What a latency profile records of the kernels it timed, beside the models: the torch
    version, its threads, how many linears of each role multiply by prepacked copies
    (`models.packed`) and, timed through an engine, each role's layout (compiled, static,
    lean, dynamic). Prepacking float32 linears halved a 2-token verify on a CPU without
    bf16 while the 1-token step (all the run's check compares) stayed put, so a profile of
    the plain linears was reused and priced verify blocks at twice their cost."""
    kernels: dict[str, Any] = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "packed_linears": {
            m.role: sum(isinstance(module, PackedLinear) for module in m.model.modules())
            for m in models.all()
        },
    }
    if engine is not None:
        kernels["layouts"] = {r: runner.layout for r, runner in engine.present_runners.items()}
    return kernels


def checked_profile(
    cfg: DictConfig,
    engine: Engine,
    models: Roles,
    device: torch.device,
    batch_sizes: list[int],
    profile: LatencyProfile,
    prompt: Prompt,
    history: list[str] | None = None,
) -> tuple[LatencyProfile, ProfileCheck]:
    """`profile` when its batch-1 target times agree with this run's own forwards
    (bench/timing/profile_check.py), else one measured again, with the last check's verdict
    (`history` gets what was done)."""
    b = cfg.bench
    gamma, limit = check_gamma(int(b.gamma_max)), float(b.latency.check_factor)

    def check(candidate: LatencyProfile) -> ProfileCheck:
        return check_profile(
            engine, candidate, prompt.input_ids, gamma, int(b.max_new_tokens), limit
        )

    verdict = check(profile)
    if verdict.agrees:
        return profile, verdict
    log.warning(
        "bench: this run's target forwards take %s x the latency profile's (limit %.1fx): "
        "measuring the profile again",
        None if verdict.ratio is None else f"{verdict.ratio:.2f}",
        limit,
    )
    profile = measure_profile(cfg, models, device, batch_sizes, engine)
    if history is not None:
        history.append("measured again: the previous one disagreed with the run's forwards")
    verdict = check(profile)
    if not verdict.agrees:
        log.warning(
            "bench: could not measure a latency profile that agrees with this run's forwards "
            "(%s x, limit %.1fx; the load is changing): sd's gamma is bench.latency."
            "unchecked_gamma=%d, not chosen from the profile",
            None if verdict.ratio is None else f"{verdict.ratio:.2f}",
            limit,
            int(b.latency.unchecked_gamma),
        )
    return profile, verdict


def check_gamma(gamma_max: int) -> int:
    """The sd gamma the profile's check decodes with: half of gamma_max, at least 1, but never
    beyond gamma_max, so its target forwards (gamma + 1 tokens wide) are ones the profile
    covers; with gamma_max=0 a check at gamma 1 found no profiled width, disagreed, and had
    the profile measured twice for nothing."""
    return min(max(1, gamma_max // 2), gamma_max)


def sd_gamma(
    cfg: DictConfig,
    profile: LatencyProfile,
    alpha: float,
    batch_size: int,
    verdict: ProfileCheck | None = None,
) -> int:
    """methods.sd.gamma, or for `auto` the implied-speedup optimum at this batch size; 0 (no
    drafts: target-only decoding) when no gamma pays, as on a CPU whose forward at a large
    batch costs in proportion to the tokens it verifies. A profile that disagrees with the
    run's own forwards (`verdict`) chooses nothing: bench.latency.unchecked_gamma, never
    beyond bench.gamma_max (sd's planner plays only 0..gamma_max, so a larger one would be
    reported while sd ran another)."""
    if cfg.methods.sd.gamma == "auto":
        gamma_max = int(cfg.bench.gamma_max)
        if verdict is not None and not verdict.agrees:
            return min(int(cfg.bench.latency.unchecked_gamma), gamma_max)
        return profile.best_gamma(alpha, range(0, gamma_max + 1), batch_size)
    return int(cfg.methods.sd.gamma)


def gamma_source(cfg: DictConfig, verdict: ProfileCheck | None) -> str:
    """How `sd_gamma` chose sd's gamma, in the words results.md prints after it."""
    if cfg.methods.sd.gamma != "auto":
        return "fixed by methods.sd.gamma"
    gamma_max = int(cfg.bench.gamma_max)
    if gamma_max == 0:  # the only gamma there is, whatever the profile says
        return "bench.gamma_max=0: no drafts, target-only rounds"
    if verdict is not None and not verdict.agrees:
        unchecked = int(cfg.bench.latency.unchecked_gamma)
        clamp = f", capped at bench.gamma_max={gamma_max}" if unchecked > gamma_max else ""
        return f"bench.latency.unchecked_gamma: the latency profile disagreed with the run{clamp}"
    return f"the implied-speedup optimum over 0..{gamma_max}"
