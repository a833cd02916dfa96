"""What the bench loads, measures and decides before it decodes: the models and prompts, the
engine, the latency profile (reused when it fits, checked against the run's own forwards),
alpha, sd's gamma per batch size and the methods' plan."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from sprinter_train.bench.quality.guard import tally_scores
from sprinter_train.bench.run import provenance
from sprinter_train.bench.run.methods import (
    MethodPlan,
    plan_methods,
    verifier_hidden_layer,
)
from sprinter_train.bench.run.phases import Phases, phase, runner_compile_seconds
from sprinter_train.bench.run.provenance import cores
from sprinter_train.bench.timing.latency import LatencyProfile, profile_models
from sprinter_train.bench.timing.profile_check import ProfileCheck, check_profile
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt, load_prompts
from sprinter_train.decoding.batch import DecodeStats
from sprinter_train.decoding.builder import build_engine, runner_layout
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import SpeculativeDecoding
from sprinter_train.decoding.policies.registry import traits_of
from sprinter_train.harvest.manifest import model_identity
from sprinter_train.harvest.reader import open_records, verify_hashes
from sprinter_train.models.identity import roles_differences
from sprinter_train.models.packed import PackedLinear
from sprinter_train.models.roles import Roles, load_roles

log = logging.getLogger(__name__)


@dataclass
class Setup:
    """What the bench loaded and decided before decoding: models, prompts, the engine, the
    latency profile and its check, the acceptance estimate, sd's gamma per batch size and
    the methods' plan."""

    models: Roles
    prompts: list[Prompt]
    engine: Engine
    device: torch.device
    dtype: torch.dtype
    batch_sizes: list[int]
    profile: LatencyProfile
    verdict: ProfileCheck
    alpha: float
    alpha_source: str
    gammas: dict[int, int]
    plan: MethodPlan
    gamma_source: str = ""  # how the gammas were chosen (gamma_source), as results.md says it
    profile_history: list[str] = dataclasses.field(default_factory=list)  # reused / measured
    # the untimed set-up phases so far (bench/run/phases.py): decode_all adds hf_static's and
    # the warm-ups
    phases: Phases = dataclasses.field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [m for m in self.plan.settings if m not in self.plan.skipped]


def prepare(cfg: DictConfig, device: torch.device, dtype: torch.dtype) -> Setup:
    """Load the models and prompts, build the engine, measure (or reuse and check) the
    latency profile, estimate alpha, choose sd's gamma per batch size and plan the methods."""
    b = cfg.bench
    # every verifier the methods read, its sidecar checked, before any model loads
    hidden_layer = verifier_hidden_layer(cfg)
    models = load_roles(cfg.models, device, dtype, companion=wants_companion(cfg))
    data_cfg = {**OmegaConf.to_container(cfg.data, resolve=True), "num_prompts": int(b.num_prompts)}
    prompts = load_prompts(data_cfg, models.tokenizer, split=b.split)
    if not prompts:
        raise ValueError(f"no prompts in split {b.split!r} of data={cfg.data.get('name')}")
    batch_sizes = batch_sizes_for([int(size) for size in b.batch_sizes], len(prompts))
    vocab = models.vocab_size
    engine = build_engine(
        models.target.model,
        SamplingConfig.from_cfg(cfg.sampling),
        vocab,
        draft=models.draft.model,
        companion=None if models.companion is None else models.companion.model,
        layout=runner_layout(cfg.decoding, device),
        hidden_layer=hidden_layer,
        eos_token_id=models.eos_token_id,
        pack_every=int(cfg.decoding.pack_every),
    )
    began = time.perf_counter()
    history: list[str] = []  # what this run did for its profile, as results.md says it
    phases: Phases = []
    compiling = runner_compile_seconds(engine)
    with phase(phases, "latency profile", compiling):
        profile = latency_profile(cfg, models, device, batch_sizes, engine, history)
    log.info(
        "bench: latency profile ready in %.1f s (%.1f s of it compiling)",
        time.perf_counter() - began,
        compiling(),
    )
    identities = {role: model_identity(getattr(models, role)) for role in ("target", "draft")}
    with phase(phases, "alpha and the profile's check", compiling):
        alpha, alpha_source = estimate_alpha(engine, prompts[0], cfg, identities)
        profile, verdict = checked_profile(
            cfg, engine, models, device, batch_sizes, profile, prompts[0], history
        )
    engine.timings.set_priors(**profile.priors())  # then corrected by the run's forwards
    log.info(
        "bench: profile, alpha %.3f and the profile's check in %.1f s",
        alpha,
        time.perf_counter() - began,
    )
    gammas = {size: sd_gamma(cfg, profile, alpha, size, verdict) for size in batch_sizes}
    plan = plan_methods(
        cfg,
        gammas[1],
        models.draft.model,
        models.companion is not None,
        device,
        draft_identity=model_identity(models.draft),
        alpha=alpha,
        identities={m.role: model_identity(m) for m in models.all()},
        prompt_ids=[p.prompt_id for p in prompts],
    )
    for name, reason in plan.skipped.items():
        log.warning("bench: skipping %s: %s", name, reason)
    if all(name in plan.skipped for name in plan.settings.keys() | plan.skipped.keys()):
        reasons = "; ".join(f"{name}: {why}" for name, why in plan.skipped.items())
        raise ValueError(f"stage=bench: every method of bench.methods was skipped ({reasons})")
    tally_scores(plan)  # the trained verifiers' mean scores, for results.md's domain check
    return Setup(
        models, prompts, engine, device, dtype, batch_sizes, profile, verdict, alpha,
        alpha_source, gammas, plan, gamma_source(cfg, verdict), history, phases,
    )  # fmt: skip


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


def wants_companion(cfg: DictConfig) -> bool:
    """Whether any method run reads the companion (SV's, and an SV table's, A): loading an
    unused one costs memory and time, and a machine may not have it (a rented GPU machine
    carries only what the run needs)."""
    methods = cfg.get("methods") or {}
    reads = {"companion", "table"}
    return any(
        reads & traits_of(methods[name], name).needs
        for name in cfg.bench.methods
        if name in methods
    )


def batch_sizes_for(asked: list[int], prompts: int) -> list[int]:
    """The batch sizes that run: batch 1 always, and none above the number of prompts (3
    prompts at batch 64 are one group of 3, which the report would call batch 64)."""
    sizes = sorted({1, *(min(size, prompts) for size in asked)})
    if any(size > prompts for size in asked):
        log.warning(
            "bench: %d prompts: batch sizes %s run as %s (a group cannot hold more rows than "
            "there are prompts)",
            prompts,
            sorted(asked),
            sizes,
        )
    return sizes
