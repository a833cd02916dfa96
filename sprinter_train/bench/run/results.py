"""results.json's figures from the runs: the batch-1 run with quality and law distances,
one section per batch size, and what the run was measured with."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from sprinter_train.bench.peers.vllm_peer import add_figures
from sprinter_train.bench.quality.guard import guard_results, tallies
from sprinter_train.bench.quality.law_distance import first_token_tv
from sprinter_train.bench.report.oracle import add_oracle_shares
from sprinter_train.bench.report.summary import greedy_differences, summarise, summarise_batch
from sprinter_train.bench.report.tables import UNSUPPORTED
from sprinter_train.bench.run import provenance
from sprinter_train.bench.run.methods import MethodPlan
from sprinter_train.bench.run.prepare import Setup
from sprinter_train.bench.run.runs import GroupRun, groups
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies.registry import as_record, traits_of, with_trait


def summarise_runs(
    cfg: DictConfig,
    setup: Setup,
    runs: dict[int, dict[str, list[GroupRun]]],
    warmups: dict[int, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """results.json's figures: the batch-1 run with quality and law distances, one section
    per batch size (with each method's untimed warm-up seconds, compilation included), what
    the run was measured with (profile, alpha, settings, traits) and its set-up phases."""
    b, models, plan, names = cfg.bench, setup.models, setup.plan, setup.names
    tokenizer, greedy = models.tokenizer, setup.engine.sampling.greedy
    scores = tallies(plan)  # before the law distances' rounds add to them
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
            "warmup_s": (warmups or {}).get(size, {}),
            "unsupported": {n: f"{UNSUPPORTED}: HF decodes one sequence" for n in peers}
            if size > 1
            else {},
        }
        for size in setup.batch_sizes
    }
    differing = {str(s): greedy_differences(runs[s], greedy) for s in setup.batch_sizes if s > 1}
    add_figures(results, plan.settings, differing)  # vLLM's own figures beside the bench's
    add_oracle_shares(results, with_trait(cfg.methods, list(plan.policies), lossless=True))
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
            "sd_gamma_source": setup.gamma_source,
            "gamma_max": int(b.gamma_max),
            "law_distance_prompts": min(int(b.law_distance_prompts), len(setup.prompts)),
            "latency_profile": {
                "target_ms": profile.target_ms,
                "draft_ms": profile.draft_ms,
                "companion_ms": profile.companion_ms,
                "by_batch": profile.by_batch(setup.batch_sizes, int(b.gamma_max) + 1),
                "check": setup.verdict.as_dict(),
                "history": setup.profile_history,
            },
            "settings": plan.settings,
            # the untimed set-up phases: seconds, compile seconds, graphs (bench/run/phases.py)
            "setup_phases": list(setup.phases),
            "traits": {n: as_record(traits_of(cfg.methods[n], n)) for n in plan.policies},
            "skipped": plan.skipped,
            "models": {
                "target": models.target.name,
                "draft": models.draft.name,
                "companion": models.companion.name if models.companion else None,
            },
        }
    )
    guard_results(results, scores, b.get("guard"))
    return results


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
