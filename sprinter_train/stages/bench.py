"""stage=bench: every method on the same prompts, side by side, speed and quality.

python -m sprinter_train stage=bench experiment=<exp> [bench.num_prompts=20 bench.max_new_tokens=64]

Per prompt, every method runs in turn (same seed), so machine noise hits all alike; wall time
is taken after warm-up with device synchronisation, never CPU time. Results go to
artifacts/<exp>/bench/ (a multirun job writes bench/sweep/<overrides>/), and the Pareto plot
is redrawn from every results.json of the experiment.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from sprinter_train.bench.energy import EnergyMeter
from sprinter_train.bench.judge import build_judge, win_tie, win_tie_rate
from sprinter_train.bench.latency import LatencyProfile, profile_models
from sprinter_train.bench.methods import plan_methods
from sprinter_train.bench.peer import run_hf_assisted
from sprinter_train.bench.quality import rouge_l, target_perplexity
from sprinter_train.bench.report import check_targets, plot_results, write_results
from sprinter_train.core.runtime import resolve_device, resolve_dtype, set_threads
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt, load_prompts
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import SpeculativeDecoding
from sprinter_train.decoding.runner import ModelRunner
from sprinter_train.decoding.state import DecodeStats
from sprinter_train.harvest.reader import open_records
from sprinter_train.models.forward import HarvestModels, load_harvest_models

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


def latency_profile(cfg: DictConfig, models: HarvestModels, device: torch.device) -> LatencyProfile:
    path = Path(cfg.experiment_dir) / "bench" / "latency.json"
    dtype = str(next(models.target.model.parameters()).dtype).removeprefix("torch.")
    lat = cfg.bench.latency
    if lat.reuse and path.exists():
        profile = LatencyProfile.load(path)
        fits = len(profile.target_ms) >= cfg.bench.gamma_max + 1
        if profile.device == str(device) and profile.dtype == dtype and fits:
            return profile
    companion = models.companion.model if models.companion is not None else None
    profile = profile_models(
        models.target.model,
        models.draft.model,
        companion,
        int(cfg.bench.gamma_max),
        int(lat.reps),
        int(lat.context_tokens),
        device,
    )
    profile.save(path)
    return profile


def estimate_alpha(engine: Engine, prompt: Prompt, cfg: DictConfig) -> tuple[float, str]:
    """The draft's acceptance rate alpha and where it came from: the mean beta = sum min(p, q)
    of the experiment's records when there are any (thousands of positions), else SD's
    acceptance on the warm-up prompt (noisy: one prompt)."""
    try:
        records = open_records(cfg.experiment_dir, columns=["beta"], stage="stage=bench")
        if len(records.frame):
            return float(records.frame["beta"].mean()), f"records ({len(records.frame)} rows)"
    except FileNotFoundError:
        pass
    stats = DecodeStats()
    for run in range(max(1, int(cfg.bench.warmup_runs))):
        policy = SpeculativeDecoding(max(1, int(cfg.bench.gamma_max) // 2))
        result = engine.generate([prompt.input_ids], policy, cfg.bench.max_new_tokens, [run])
        stats.add(result[0].stats)
    return stats.accepted / max(stats.drafted, 1), "sd on the warm-up prompt"


def run(cfg: DictConfig) -> dict[str, Any]:
    b = cfg.bench
    set_threads(cfg.get("num_threads"))
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    models = load_harvest_models(cfg.models, device, dtype)
    tokenizer = models.tokenizer
    data_cfg = {**OmegaConf.to_container(cfg.data, resolve=True), "num_prompts": int(b.num_prompts)}
    prompts = load_prompts(data_cfg, tokenizer, split=b.split)
    if not prompts:
        raise ValueError(f"no prompts in split {b.split!r} of data={cfg.data.get('name')}")
    sampling = SamplingConfig.from_cfg(cfg.sampling)
    vocab = models.vocab_size
    engine = Engine(
        ModelRunner(models.target.model, vocab),
        sampling,
        draft=ModelRunner(models.draft.model, vocab),
        companion=ModelRunner(models.companion.model, vocab)
        if models.companion is not None
        else None,
        eos_token_id=models.eos_token_id,
    )
    profile = latency_profile(cfg, models, device)
    alpha, alpha_source = estimate_alpha(engine, prompts[0], cfg)
    if cfg.methods.sd.gamma == "auto":
        gamma = profile.best_gamma(alpha, range(1, int(b.gamma_max) + 1))
    else:
        gamma = int(cfg.methods.sd.gamma)
    plan = plan_methods(
        cfg, profile, gamma, models.draft.model, models.companion is not None, device
    )
    for name, reason in plan.skipped.items():
        log.warning("bench: skipping %s: %s", name, reason)
    names = [m for m in b.methods if m not in plan.skipped]

    def decode(name: str, prompt: Prompt, seed: int) -> tuple[list[int], float, DecodeStats]:
        if name in plan.peers:
            peer = run_hf_assisted(
                models.target.model,
                models.draft.model,
                prompt.input_ids,
                sampling=sampling,
                max_new_tokens=int(b.max_new_tokens),
                seed=seed,
                eos_token_id=models.eos_token_id,
                device=device,
                **plan.peers[name],
            )
            stats = DecodeStats(target_calls=peer.target_calls, draft_calls=peer.draft_calls)
            return peer.tokens, peer.wall_s, stats
        policy = plan.policies[name]
        result = engine.generate([prompt.input_ids], policy, int(b.max_new_tokens), [seed])[0]
        return result.tokens, result.wall_s, result.stats

    for name in names:  # warm-up: caches, allocator, oneDNN kernels
        for run_index in range(int(b.warmup_runs)):
            decode(name, prompts[0], int(b.seed) + run_index)

    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    progress = tqdm(list(enumerate(prompts)), desc="bench prompts", unit="prompt")
    for index, prompt in progress:
        for name in names:
            meter = EnergyMeter(device) if b.energy else None
            if meter:
                meter.start()
            tokens, wall, stats = decode(name, prompt, int(b.seed) + index)
            joules = meter.stop() if meter else None
            runs[name].append(
                {
                    "prompt": prompt,
                    "tokens": tokens,
                    "wall_s": wall,
                    "stats": stats,
                    "joules": joules,
                    "energy_reason": meter.unavailable_reason if meter else "disabled",
                }
            )

    results = summarise(runs, models, tokenizer, cfg)
    results.update(
        {
            "experiment": cfg.experiment,
            "device": str(device),
            "dtype": str(dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(),
            "sampling": OmegaConf.to_container(cfg.sampling),
            "num_prompts": len(prompts),
            "max_new_tokens": int(b.max_new_tokens),
            "alpha": alpha,
            "alpha_source": alpha_source,
            "sd_gamma": gamma,
            "latency_profile": {
                "target_ms": profile.target_ms,
                "draft_ms": profile.draft_ms,
                "companion_ms": profile.companion_ms,
            },
            "settings": plan.settings,
            "skipped": plan.skipped,
            "models": {
                "target": models.target.name,
                "draft": models.draft.name,
                "companion": models.companion.name if models.companion else None,
            },
        }
    )
    results["targets"] = check_targets(results, OmegaConf.to_container(b.get("targets") or {}))
    out = output_dir(cfg)
    write_results(out, results)
    plot_results(out, Path(cfg.experiment_dir) / "bench")
    log.info("bench: wrote %s", out / "results.md")
    return {"results": str(out / "results.json"), "methods": results["methods"]}


def summarise(
    runs: dict[str, list[dict[str, Any]]], models: HarvestModels, tokenizer, cfg: DictConfig
) -> dict[str, Any]:
    """Per method: speed, calls, acceptance, quality (ROUGE-L, target perplexity, win-tie)."""
    text = {
        name: [tokenizer.decode(r["tokens"], skip_special_tokens=True) for r in rs]
        for name, rs in runs.items()
    }
    judge = None
    if cfg.bench.judge.enabled:
        local = models.target if cfg.bench.judge.local == "target" else models.draft
        judge = build_judge(dict(cfg.bench.judge), local.model, local.tokenizer)
    baseline = cfg.bench.judge.baseline
    methods: dict[str, Any] = {}
    for name, rs in runs.items():
        stats = DecodeStats()
        for r in rs:
            stats.add(r["stats"])
        tokens = sum(len(r["tokens"]) for r in rs)
        wall = sum(r["wall_s"] for r in rs)
        refs = [
            (t, r["prompt"].reference)
            for t, r in zip(text[name], rs, strict=True)
            if r["prompt"].reference
        ]
        row: dict[str, Any] = {
            "tokens": tokens,
            "wall_s": wall,
            "tokens_per_s": tokens / wall if wall > 0 else float("nan"),
            "target_calls": stats.target_calls,
            "draft_calls": stats.draft_calls,
            "companion_calls": stats.companion_calls,
            "tokens_per_target_call": tokens / max(stats.target_calls, 1),
            **acceptance(stats),
            "rouge_l_ref": 100 * sum(rouge_l(t, ref) for t, ref in refs) / len(refs)
            if refs
            else None,
            "target_ppl": _mean(
                target_perplexity(models.target.model, r["prompt"].input_ids, r["tokens"])
                for r in rs
            ),
            "time_breakdown_s": {
                "target": stats.target_seconds,
                "draft": stats.draft_seconds,
                "companion": stats.companion_seconds,
                "verifier": stats.verifier_seconds,
            },
        }
        if "target_only" in runs:
            row["rouge_l_vs_target"] = 100 * _mean(
                rouge_l(t, ref) for t, ref in zip(text[name], text["target_only"], strict=True)
            )
        joules = [r["joules"] for r in rs]
        row["joules_per_token"] = sum(joules) / tokens if None not in joules and tokens else None
        row["energy_note"] = None if row["joules_per_token"] is not None else rs[0]["energy_reason"]
        if judge is not None and baseline in runs and name != baseline:
            outcomes = [
                win_tie(judge, r["prompt"].text, t, tb)
                for r, t, tb in zip(rs, text[name], text[baseline], strict=True)
            ]
            row["win_tie_vs_" + baseline] = win_tie_rate(outcomes)
        methods[name] = row
    for row in methods.values():
        for ref in ("target_only", "sd"):
            base = methods.get(ref, {}).get("tokens_per_s")
            row[f"speedup_vs_{ref}"] = row["tokens_per_s"] / base if base else None
    return {"methods": methods, "judge": _judge_name(judge)}


def acceptance(stats: DecodeStats) -> dict[str, float | None]:
    """acceptance_rate: of the drafted tokens the target checked, the share it kept (sd's
    alpha); verifier_acceptance_rate: of all drafted tokens, the share committed on a
    verifier's word without a target check (sprinter's; None for methods without one)."""
    checked = stats.drafted - stats.verifier_accepted
    return {
        "acceptance_rate": stats.accepted / checked if checked else None,
        "verifier_acceptance_rate": stats.verifier_accepted / stats.drafted
        if stats.verifier_calls and stats.drafted
        else None,
    }


def _judge_name(judge) -> str | None:
    return None if judge is None else type(judge).__name__


def _mean(values) -> float:
    values = [v for v in values if v == v]  # drop NaN (empty outputs)
    return sum(values) / len(values) if values else float("nan")
