"""stage=bench: every method on the same prompts, side by side, speed and quality, at every
batch size of `bench.batch_sizes`.

python -m sprinter_train stage=bench experiment=<exp> [bench.num_prompts=20 bench.max_new_tokens=64]

At each batch size the prompts are decoded in consecutive groups of that size; per group every
method runs in turn (prompt i with seed + i), so machine noise hits all alike; wall time is
taken after warm-up with device synchronisation, never CPU time. The batch-1 run also gets
the quality figures (ROUGE-L, perplexity, judge, energy); HF's peers run at batch 1 only.
Results go to artifacts/<exp>/bench/ (a multirun job writes bench/sweep/<overrides>/), and
the Pareto plot is redrawn from every results.json of the experiment.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from sprinter_train.bench import provenance
from sprinter_train.bench.latency import LatencyProfile, profile_models
from sprinter_train.bench.law_distance import first_token_tv
from sprinter_train.bench.methods import (
    MethodPlan,
    at_batch_size,
    plan_methods,
    verifier_hidden_layer,
)
from sprinter_train.bench.peer import run_hf_assisted
from sprinter_train.bench.profile_check import ProfileCheck, check_profile
from sprinter_train.bench.provenance import cores
from sprinter_train.bench.report import UNSUPPORTED, check_targets, plot_results, write_results
from sprinter_train.bench.runs import Decoded, GroupRun, engine_decode, groups, run_methods
from sprinter_train.bench.summary import greedy_differences, summarise, summarise_batch
from sprinter_train.core.runtime import resolve_device, resolve_dtype, set_threads
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt, load_prompts
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import SpeculativeDecoding
from sprinter_train.decoding.registry import as_record, traits_of, with_trait
from sprinter_train.decoding.runner import ModelRunner
from sprinter_train.decoding.state import DecodeStats
from sprinter_train.harvest.manifest import model_identity
from sprinter_train.harvest.reader import open_records, verify_hashes
from sprinter_train.models.roles import Roles, load_roles

log = logging.getLogger(__name__)


def output_dir(cfg: DictConfig) -> Path:
    """bench/ for a single run; bench/sweep/<overrides> for each job of a Hydra multirun."""
    base = Path(cfg.experiment_dir) / "bench"
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode == RunMode.MULTIRUN:
            return base / "sweep" / (hydra_cfg.job.override_dirname or str(hydra_cfg.job.num))
    except ValueError:  # not launched by Hydra (tests, stage=all from code)
        pass
    return base


def latency_profile(
    cfg: DictConfig, models: Roles, device: torch.device, batch_sizes: list[int]
) -> LatencyProfile:
    """bench/latency.json when it was measured on this device and dtype, covers every batch
    size with 1..gamma_max + 1 tokens a row and was not measured under load (and
    `bench.latency.reuse`), else a new one."""
    path = Path(cfg.experiment_dir) / "bench" / "latency.json"
    dtype = str(next(models.target.model.parameters()).dtype).removeprefix("torch.")
    lat = cfg.bench.latency
    if lat.reuse and path.exists():
        profile = LatencyProfile.load(path)
        fits = profile.covers(batch_sizes, int(cfg.bench.gamma_max) + 1)
        if profile.device == str(device) and profile.dtype == dtype and fits:
            if not profile.measured_under_load:
                return profile
            log.warning(
                "bench: re-measuring latency: %s was measured under load %s (or records none) "
                "on %d cores",
                path,
                profile.load_average,
                cores(),
            )
    return measure_profile(cfg, models, device, batch_sizes)


def measure_profile(
    cfg: DictConfig, models: Roles, device: torch.device, batch_sizes: list[int]
) -> LatencyProfile:
    """A new latency profile, saved as bench/latency.json."""
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
    )
    profile.save(Path(cfg.experiment_dir) / "bench" / "latency.json")
    return profile


def checked_profile(
    cfg: DictConfig,
    engine: Engine,
    models: Roles,
    device: torch.device,
    batch_sizes: list[int],
    profile: LatencyProfile,
    prompt: Prompt,
) -> tuple[LatencyProfile, ProfileCheck]:
    """`profile` when its batch-1 target times agree with this run's own forwards
    (bench/profile_check.py), else one measured again, with the last check's verdict."""
    b = cfg.bench
    gamma, limit = max(1, int(b.gamma_max) // 2), float(b.latency.check_factor)

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
    profile = measure_profile(cfg, models, device, batch_sizes)
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


def estimate_alpha(engine: Engine, prompt: Prompt, cfg: DictConfig) -> tuple[float, str]:
    """The draft's acceptance rate alpha and where it came from: the mean beta = sum min(p, q)
    of the experiment's records when there are any (thousands of positions), else SD's
    acceptance on the warm-up prompt (noisy: one prompt)."""
    note = ""
    try:
        records = open_records(
            cfg.experiment_dir, columns=["beta"], stage="stage=bench", verify=verify_hashes(cfg)
        )
        measured = records.manifest.get("sampling")
        bench = asdict(SamplingConfig.from_cfg(cfg.sampling))
        if measured is not None and measured != bench:
            # beta depends on the warping: records of other sampling would pick a wrong gamma
            note = f" (records refused: measured under sampling {measured}, the bench's {bench})"
            log.warning("bench: alpha not taken from the records%s", note)
        elif len(records.frame):
            return float(records.frame["beta"].mean()), f"records ({len(records.frame)} rows)"
    except FileNotFoundError:
        pass
    stats = DecodeStats()
    for run in range(max(1, int(cfg.bench.warmup_runs))):
        policy = SpeculativeDecoding(max(1, int(cfg.bench.gamma_max) // 2))
        result = engine.generate([prompt.input_ids], policy, cfg.bench.max_new_tokens, [run])
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
    run's own forwards (`verdict`) chooses nothing: bench.latency.unchecked_gamma."""
    if cfg.methods.sd.gamma == "auto":
        if verdict is not None and not verdict.agrees:
            return int(cfg.bench.latency.unchecked_gamma)
        return profile.best_gamma(alpha, range(0, int(cfg.bench.gamma_max) + 1), batch_size)
    return int(cfg.methods.sd.gamma)


def law_distance(
    engine: Engine, plan: MethodPlan, names: list[str], prompts: list[Prompt], cfg: DictConfig
) -> dict[str, list[float]]:
    """Per method whose traits say its first-token law is computed (`law_computed`): the exact
    TV of its first token's law from the target's on the first `bench.law_distance_prompts`
    prompts (0 up to rounding for a lossless rule, the loss of a lossy one)."""
    ids = [p.input_ids for p in prompts[: int(cfg.bench.law_distance_prompts)]]
    computed = with_trait(cfg.methods, [n for n in names if n in plan.policies], law_computed=True)
    return {name: first_token_tv(engine, plan.policies[name], ids) for name in computed if ids}


def input_hashes(plan: MethodPlan) -> dict[str, dict[str, str | None]]:
    """sha256 of every verifier and SV table a method loaded, by path."""
    found: dict[str, dict[str, str | None]] = {"verifiers": {}, "tables": {}}
    for settings in plan.settings.values():
        for key, kind in (("verifier", "verifiers"), ("table", "tables")):
            entry = settings.get(key)
            if isinstance(entry, dict) and entry.get("path"):
                found[kind][entry["path"]] = provenance.file_hash(entry["path"])
    return found


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

    @property
    def names(self) -> list[str]:
        return [m for m in self.plan.settings if m not in self.plan.skipped]


def run(cfg: DictConfig) -> dict[str, Any]:
    set_threads(cfg.get("num_threads"))
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    started = provenance.start(cfg, device, dtype)
    setup = prepare(cfg, device, dtype)
    runs = decode_all(cfg, setup)
    results = summarise_runs(cfg, setup, runs)
    results["provenance"] = provenance.finish(
        started,
        models=provenance.model_hashes(
            {
                "target": setup.models.target,
                "draft": setup.models.draft,
                "companion": setup.models.companion,
            }
        ),
        **input_hashes(setup.plan),
    )
    b = cfg.bench
    results["targets"] = check_targets(results, OmegaConf.to_container(b.get("targets") or {}))
    out = output_dir(cfg)
    write_results(out, results)
    plot_results(out, Path(cfg.experiment_dir) / "bench")
    log.info("bench: wrote %s", out / "results.md")
    return {"results": str(out / "results.json"), "methods": results["methods"]}


def prepare(cfg: DictConfig, device: torch.device, dtype: torch.dtype) -> Setup:
    """Load the models and prompts, build the engine, measure (or reuse and check) the
    latency profile, estimate alpha, choose sd's gamma per batch size and plan the methods."""
    b = cfg.bench
    models = load_roles(cfg.models, device, dtype)
    data_cfg = {**OmegaConf.to_container(cfg.data, resolve=True), "num_prompts": int(b.num_prompts)}
    prompts = load_prompts(data_cfg, models.tokenizer, split=b.split)
    if not prompts:
        raise ValueError(f"no prompts in split {b.split!r} of data={cfg.data.get('name')}")
    batch_sizes = sorted({1, *(int(size) for size in b.batch_sizes)})  # batch 1 always runs
    vocab = models.vocab_size
    engine = Engine(
        ModelRunner(models.target.model, vocab),
        SamplingConfig.from_cfg(cfg.sampling),
        draft=ModelRunner(models.draft.model, vocab, hidden_layer=verifier_hidden_layer(cfg)),
        companion=ModelRunner(models.companion.model, vocab)
        if models.companion is not None
        else None,
        eos_token_id=models.eos_token_id,
        pack_every=int(cfg.decoding.pack_every),
    )
    profile = latency_profile(cfg, models, device, batch_sizes)
    alpha, alpha_source = estimate_alpha(engine, prompts[0], cfg)
    profile, verdict = checked_profile(
        cfg, engine, models, device, batch_sizes, profile, prompts[0]
    )
    engine.timings.set_priors(**profile.priors())  # then corrected by the run's forwards
    gammas = {size: sd_gamma(cfg, profile, alpha, size, verdict) for size in batch_sizes}
    plan = plan_methods(
        cfg,
        gammas[1],
        models.draft.model,
        models.companion is not None,
        device,
        draft_identity=model_identity(models.draft),
        alpha=alpha,
    )
    for name, reason in plan.skipped.items():
        log.warning("bench: skipping %s: %s", name, reason)
    return Setup(
        models, prompts, engine, device, dtype, batch_sizes, profile, verdict, alpha,
        alpha_source, gammas, plan,
    )  # fmt: skip


def decode_all(cfg: DictConfig, setup: Setup) -> dict[int, dict[str, list[GroupRun]]]:
    """Every method on every group of prompts at every batch size, side by side (HF's peers
    at batch 1 only: they decode one sequence)."""
    b, plan, models = cfg.bench, setup.plan, setup.models

    def decode_peer(name: str, group: list[Prompt], seeds: list[int]) -> Decoded:
        (prompt,), (seed,) = group, seeds
        peer = run_hf_assisted(
            models.target.model,
            models.draft.model,
            prompt.input_ids,
            sampling=setup.engine.sampling,
            max_new_tokens=int(b.max_new_tokens),
            seed=seed,
            eos_token_id=models.eos_token_id,
            device=setup.device,
            **plan.peers[name],
        )
        stats = DecodeStats(target_calls=peer.target_calls, draft_calls=peer.draft_calls)
        return [peer.tokens], peer.wall_s, stats

    runs: dict[int, dict[str, list[GroupRun]]] = {}
    for size in setup.batch_sizes:
        sized = at_batch_size(plan, cfg, setup.gammas[size])
        on_engine = engine_decode(setup.engine, sized.policies, int(b.max_new_tokens))

        def decode(name: str, group: list[Prompt], seeds: list[int], on_engine=on_engine):
            return (decode_peer if name in plan.peers else on_engine)(name, group, seeds)

        runs[size] = run_methods(
            decode,
            [n for n in setup.names if size == 1 or n not in plan.peers],
            setup.prompts,
            size,
            int(b.seed),
            int(b.warmup_runs),
            setup.device if b.energy and size == 1 else None,
            int(b.min_timed_runs),
        )
    return runs


def summarise_runs(
    cfg: DictConfig, setup: Setup, runs: dict[int, dict[str, list[GroupRun]]]
) -> dict[str, Any]:
    """results.json's figures: the batch-1 run with quality and law distances, one section
    per batch size, and what the run was measured with (profile, alpha, settings, traits)."""
    b, models, plan, names = cfg.bench, setup.models, setup.plan, setup.names
    tokenizer, greedy = models.tokenizer, setup.engine.sampling.greedy
    results = summarise(runs[1], models, tokenizer, cfg)
    for name, count in greedy_differences(runs[1], greedy).items():
        results["methods"][name]["outputs_differing_from_target_only"] = count
    distances = law_distance(setup.engine, plan, names, setup.prompts, cfg)
    for name, tvs in distances.items():
        results["methods"][name]["tv_first_token"] = sum(tvs) / len(tvs)
        results["methods"][name]["tv_first_token_per_prompt"] = tvs
    peers = [n for n in names if n in plan.peers]
    results["batches"] = {
        str(size): {
            "methods": summarise_batch(runs[size], tokenizer),
            "sd_gamma": setup.gammas[size],
            "groups": len(groups(len(setup.prompts), size)),
            "unsupported": {n: f"{UNSUPPORTED}: HF decodes one sequence" for n in peers}
            if size > 1
            else {},
        }
        for size in setup.batch_sizes
    }
    profile = setup.profile
    results.update(
        {
            "experiment": cfg.experiment,
            "device": str(setup.device),
            "dtype": str(setup.dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(),
            "sampling": OmegaConf.to_container(cfg.sampling),
            "num_prompts": len(setup.prompts),
            "max_new_tokens": int(b.max_new_tokens),
            "batch_sizes": setup.batch_sizes,
            "alpha": setup.alpha,
            "alpha_source": setup.alpha_source,
            "sd_gamma": setup.gammas[1],
            "law_distance_prompts": min(int(b.law_distance_prompts), len(setup.prompts)),
            "latency_profile": {
                "target_ms": profile.target_ms,
                "draft_ms": profile.draft_ms,
                "companion_ms": profile.companion_ms,
                "by_batch": profile.by_batch(setup.batch_sizes, int(b.gamma_max) + 1),
                "check": setup.verdict.as_dict(),
            },
            "settings": plan.settings,
            "traits": {n: as_record(traits_of(cfg.methods[n], n)) for n in plan.policies},
            "skipped": plan.skipped,
            "models": {
                "target": models.target.name,
                "draft": models.draft.name,
                "companion": models.companion.name if models.companion else None,
            },
        }
    )
    return results
