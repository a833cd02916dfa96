"""Run a harvest under Lightning Fabric: one process, or DDP over devices and nodes.

Every rank loads the models, plans the same shards, takes every world_size-th one, skips
those already complete and writes its own; rank 0 then writes the manifest. Shard names and
contents do not depend on the rank count, so any world size yields the same record set.
With devices=1 nothing is spawned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning_fabric import Fabric
from lightning_fabric.strategies import DDPStrategy
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from sprinter_train.core.interrupt import note_completed
from sprinter_train.core.io import write_json
from sprinter_train.core.runtime import resolve_device, resolve_dtype, set_threads
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.core.validation import prompt_room
from sprinter_train.data.prompts import Prompt, load_prompts
from sprinter_train.decoding.builder import runner_layout
from sprinter_train.harvest.account import interleaved_note, throughput
from sprinter_train.harvest.continuations import (
    ContinuationRunners,
    HarvestSequence,
    build_sequences,
    runners_for,
)
from sprinter_train.harvest.manifest import build_manifest, count_records, harvest_fingerprint
from sprinter_train.harvest.mixes import assign_mixes
from sprinter_train.harvest.options import (
    HarvestOptions,
    harvest_problems,
    resolve_accept,
    shared_rows_of,
)
from sprinter_train.harvest.records import RecordBatch, array_widths, concat_batches, harvest_batch
from sprinter_train.harvest.shards import (
    ShardPlan,
    plan_shards,
    remove_stale_files,
    shard_is_complete,
    write_shard,
)
from sprinter_train.models.roles import Roles, load_roles

log = logging.getLogger(__name__)

# the settings' readers and checks live in options.py; stages/settings.py, the tests and
# benchmarks/harvest_throughput.py reach them here as well
__all__ = [
    "HarvestOptions",
    "harvest",
    "harvest_problems",
    "harvest_prompts",
    "make_fabric",
    "max_context",
    "rank_main",
    "resolve_accept",
    "shared_rows_of",
]


def harvest_prompts(
    models: Roles,
    prompts: Sequence[Prompt],
    mixes: Sequence[str],
    options: HarvestOptions,
    batch_size: int,
    device: torch.device,
    on_batch: Callable[[int, int], None] | None = None,
    generation_batch_size: int = 64,
    statistics_rows: int = 32,
    shared_generation_rows: int = 8,
    *,
    runners: ContinuationRunners,
    phase_seconds: dict[str, float] | None = None,
) -> tuple[RecordBatch, list[HarvestSequence]]:
    """Records of `prompts` in order: build the sequences, then one forward per model a batch.

    Prompts go in length order (padding is wasted compute) and the prompt order is restored
    afterwards. Continuations are generated for up to `generation_batch_size` prompts at a
    time (each mix one batched engine call: a decode step costs about the same for 2 rows as
    for 30 on a CPU; up to `shared_generation_rows` target and interleaved rows share one),
    then teacher-forced `batch_size` sequences at a time; per-prompt random streams keep the
    records independent of all three (and of `pack_every` and, but for the matmuls' rounding,
    of the runners' layout). Every generation call runs on `runners` (`models`' own): the
    harvest passes its own, made once in the `decoding` section's layout and `pack_every`
    (`ContinuationRunners`). `phase_seconds`, when given, gains the seconds spent generating
    continuations (`generation`) and teacher-forcing the sequences (`teacher_forced`).
    """
    runners = runners_for(models, runners)
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i].input_ids), i))
    built_of: dict[int, HarvestSequence] = {}
    clock = time.perf_counter()
    for start in range(0, len(order), max(1, generation_batch_size)):
        chunk = order[start : start + max(1, generation_batch_size)]
        built = build_sequences(
            models,
            [prompts[i] for i in chunk],
            [mixes[i] for i in chunk],
            options.continuation_tokens,
            options.positions_per_prompt,
            options.gamma,
            options.runs,
            options.sampling,
            options.seed,
            shared_generation_rows,
            runners=runners,
        )
        built_of.update(zip(chunk, built, strict=True))
    generated = time.perf_counter()
    batches, sequences, rows_of, offset = [], {}, {}, 0
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        built = [built_of[i] for i in chunk]
        batch = harvest_batch(
            models,
            built,
            options.sampling,
            options.hidden_layer,
            options.seed,
            device,
            statistics_rows,
        )
        for i, seq in zip(chunk, built, strict=True):
            count = max(0, seq.region_end - seq.region_start)
            rows_of[i] = np.arange(offset, offset + count)
            sequences[i] = seq
            offset += count
        batches.append(batch)
        if on_batch is not None:
            on_batch(len(built), batch.rows)
    if phase_seconds is not None:  # the rows came back as host arrays: the device is done
        phase_seconds["generation"] = phase_seconds.get("generation", 0.0) + generated - clock
        forced = time.perf_counter() - generated
        phase_seconds["teacher_forced"] = phase_seconds.get("teacher_forced", 0.0) + forced
    joined = concat_batches(batches, array_widths(models))
    index = np.concatenate([rows_of[i] for i in range(len(prompts))] or [np.zeros(0, int)])
    return joined.take(index), [sequences[i] for i in range(len(prompts))]


def max_context(models: Roles, reserve: int) -> int | None:
    """Longest prompt that leaves `reserve` positions for the region in every model; a model
    too short for even that stops the harvest before any work."""
    contexts = {
        m.role: getattr(m.model.config, "max_position_embeddings", None) for m in models.all()
    }
    setting = "harvest.max_positions_per_prompt (or continuation_tokens)"
    return prompt_room(contexts, reserve, setting)


def make_fabric(cfg: DictConfig) -> Fabric:
    """Single device unless harvest.strategy=ddp or several devices/nodes are asked for."""
    hcfg = cfg.harvest
    device = resolve_device(cfg.device)
    devices = hcfg.devices
    num_nodes = int(hcfg.num_nodes)
    if hcfg.strategy not in ("auto", "ddp"):
        raise ValueError(f"harvest.strategy must be auto or ddp, got {hcfg.strategy!r}")
    if hcfg.strategy == "ddp" or devices != 1 or num_nodes > 1:
        strategy: Any = DDPStrategy(
            start_method=hcfg.start_method,
            process_group_backend="gloo" if device.type == "cpu" else None,
        )
    else:
        strategy = "auto"
        if device.index is not None:
            devices = [device.index]
    return Fabric(accelerator=device.type, devices=devices, num_nodes=num_nodes, strategy=strategy)


def harvest(cfg: DictConfig) -> dict[str, Any]:
    """Launch the ranks; returns rank 0's summary."""
    return make_fabric(cfg).launch(rank_main, cfg)


def rank_main(fabric: Fabric, cfg: DictConfig) -> dict[str, Any]:
    """One rank's share of the harvest (module level: DDP spawn pickles it)."""
    set_threads(cfg.get("num_threads"))
    hcfg: dict[str, Any] = OmegaConf.to_container(cfg.harvest, resolve=True)  # type: ignore[assignment]
    data_cfg: dict[str, Any] = OmegaConf.to_container(cfg.data, resolve=True)  # type: ignore[assignment]
    options = HarvestOptions.from_cfg(hcfg, SamplingConfig.from_cfg(cfg.sampling))
    device = fabric.device
    dtype = resolve_dtype(cfg.dtype, device)
    rank, world = fabric.global_rank, fabric.world_size
    start = time.perf_counter()

    # 1. models, tokenizer check (inside the loader), prompts, mixes, shard plan
    with fabric.rank_zero_first():  # a first GGUF load writes its cache once
        models = load_roles(cfg.models, device, dtype)
    prompts = load_prompts(
        data_cfg,
        models.tokenizer,
        split=options.split,
        max_context=max_context(models, options.positions_per_prompt),
    )
    if not prompts:
        raise ValueError(f"stage=harvest found no prompts in data={data_cfg.get('name')}")
    mixes = assign_mixes([p.prompt_id for p in prompts], options.mix_weights, options.seed)
    plans = plan_shards(prompts, mixes, options.prompts_per_shard)
    if options.needs_accept():  # measured once, on rank 0: every rank uses the same alpha
        calibration = int(hcfg["calibration_prompts"])
        if rank == 0:
            options = resolve_accept(options, models, prompts, calibration, device)
        options = replace(options, interleaved_accept=fabric.broadcast(options.interleaved_accept))
        log.info("harvest.interleaved_accept=auto measured %s", options.interleaved_accept)
    fingerprint = harvest_fingerprint(models, options.fingerprint_settings(), data_cfg, dtype)
    records_dir = Path(cfg.experiment_dir) / "records"
    records_dir.mkdir(parents=True, exist_ok=True)
    dims = array_widths(models)

    # 2. this rank's shards that are not complete yet
    mine = plans[rank::world]
    todo = [plan for plan in mine if not shard_is_complete(records_dir, plan, fingerprint, dims)]
    log.info(
        "rank %d/%d: %d of %d shards to do (%d prompts), %d already complete",
        rank,
        world,
        len(todo),
        len(mine),
        sum(len(p.prompts) for p in todo),
        len(mine) - len(todo),
    )
    pace = {  # how fast, not what: none of these changes a record
        "batch_size": int(hcfg["batch_size"]),
        "generation_batch_size": int(hcfg["generation_batch_size"]),
        "statistics_rows": int(hcfg["statistics_rows"]),
        "shared_generation_rows": shared_rows_of(hcfg),
    }
    # the continuations run on the bench's engine layout (static, compiled where
    # decoding.compile says), one runner per model for the whole run: a compiled runner
    # keeps its graphs and a static one its KV buffers from batch to batch
    layout = runner_layout(cfg.decoding, device)
    runners = ContinuationRunners(models, layout, pack_every=int(cfg.decoding.pack_every))
    log.info("harvest continuations: decoding layout %s", layout)
    phases: dict[str, float] = {}
    rows = _write_shards(
        models,
        todo,
        options,
        pace,
        runners,
        device,
        records_dir,
        fingerprint,
        show=rank == 0,
        phase_seconds=phases,
    )

    # 3. totals over ranks; rank 0 describes the finished set
    totals = fabric.all_reduce(
        torch.tensor([len(todo), len(mine) - len(todo), rows], dtype=torch.float64), reduce_op="sum"
    )
    fabric.barrier()
    result: dict[str, Any] = {}
    if rank == 0:
        remove_stale_files(records_dir, {p.name for p in plans})
        counts = count_records(records_dir, plans)
        manifest = build_manifest(
            experiment=str(cfg.experiment),
            models=models,
            settings=options.fingerprint_settings(),
            config=hcfg,
            interleaved=interleaved_note(
                options.interleaved_accept, options.interleaved_max_run, hcfg
            ),
            sampling=asdict(options.sampling),
            seeds={
                "harvest": options.seed,
                "data": int(data_cfg.get("seed", 0)),
            },
            data_cfg=data_cfg,
            plans=plans,
            counts=counts,
            fingerprint=fingerprint,
            widths=dims,
            records_dir=records_dir,
            dtype=dtype,
            device=str(device),
            world_size=world,
        )
        write_json(records_dir / "manifest.json", manifest)
        written, skipped, new_rows = (int(v) for v in totals.tolist())
        seconds = time.perf_counter() - start
        result = {
            "records_dir": str(records_dir),
            "records": counts["records"],
            "prompts": counts["prompts"],
            "by_mix": counts["by_mix"],
            "prompts_by_mix": counts["prompts_by_mix"],
            "by_split": counts["by_split"],
            "shards": len(plans),
            "shards_written": written,
            "shards_skipped": skipped,
            "records_written": new_rows,
            "seconds": seconds,
            "world_size": world,
            **throughput(rows, phases),
        }
        log.info("harvest: %s", result)
    fabric.barrier()
    return result


def _write_shards(
    models: Roles,
    plans: list[ShardPlan],
    options: HarvestOptions,
    pace: dict[str, int],
    runners: ContinuationRunners,
    device: torch.device,
    records_dir: Path,
    fingerprint: str,
    show: bool,
    phase_seconds: dict[str, float] | None = None,
) -> int:
    """Harvest and write the given shards with a progress bar of prompts and records/s;
    `pace`: harvest_prompts' batch sizes; `runners`: the generation's, shared by every shard;
    `phase_seconds`: harvest_prompts'."""
    progress = tqdm(
        total=sum(len(p.prompts) for p in plans), unit="prompt", desc="harvest", disable=not show
    )
    start, rows = time.perf_counter(), 0

    def on_batch(n_prompts: int, n_rows: int) -> None:
        nonlocal rows
        rows += n_rows
        progress.update(n_prompts)
        progress.set_postfix(
            records=rows, records_per_s=f"{rows / (time.perf_counter() - start):.1f}"
        )

    try:
        for written, plan in enumerate(plans, 1):
            batch, sequences = harvest_prompts(
                models,
                plan.prompts,
                plan.mixes,
                options,
                device=device,
                on_batch=on_batch,
                runners=runners,
                phase_seconds=phase_seconds,
                **pace,
            )
            # the set stops being whole at its first rewrite, not before: a run that fails
            # before it (a setting, a model) leaves a complete record set complete
            (records_dir / "manifest.json").unlink(missing_ok=True)
            write_shard(records_dir, plan, batch, sequences, fingerprint)
            note_completed(  # what an interruption report counts as kept
                "shards", f"{written} of {len(plans)} shards written to {records_dir} (kept)"
            )
    finally:
        progress.close()
    return rows
