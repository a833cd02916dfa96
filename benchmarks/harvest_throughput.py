"""Harvest records/s against the target's teacher-forced tokens/s over the same sequences.

python benchmarks/harvest_throughput.py                           # offline default pair
python benchmarks/harvest_throughput.py --models tiny_random      # a quick check
python benchmarks/harvest_throughput.py --prompts 8 num_threads=1 models.draft.path=/my/draft

Both are measured in the same run on the same sequences and batches: the harvest (sequence
building, draft + companion + target forwards, sampling, statistics, shard writing) and the
target alone producing its logits at the recorded positions (its body over the padded batch,
its head where a record needs it). A record is one position, so the ratio is the target's
time over the harvest's: how close the harvest comes to the one target pass it cannot avoid.
`original` needs no generation; `all_mixes` uses the default equal mixes. Each scenario
runs `--repeats` times, interleaved with the other, and the ratios are the medians over the
repeats (each repeat pairs a harvest with the target pass right after it, so a noisy moment
on a shared machine skews one repeat, not the result). The last line is
`ratio_original=<x> ratio_all_mixes=<y>`. With `harvest.interleaved_accept=auto` the
pair's alpha is measured once before the timed runs, as a harvest does once per record set;
its seconds are printed apart.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from sprinter_train.core.config import compose_config
from sprinter_train.core.runtime import resolve_device, resolve_dtype, set_threads, synchronize
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import load_prompts
from sprinter_train.decoding.builder import runner_layout
from sprinter_train.harvest.continuations import ContinuationRunners, HarvestSequence
from sprinter_train.harvest.driver import (
    HarvestOptions,
    harvest_prompts,
    max_context,
    resolve_accept,
    shared_rows_of,
)
from sprinter_train.harvest.mixes import assign_mixes
from sprinter_train.harvest.records import pad_right
from sprinter_train.harvest.shards import plan_shards, write_shard
from sprinter_train.models.body import body, head_logits
from sprinter_train.models.roles import Roles, load_roles


@torch.no_grad()
def target_teacher_forced(
    models: Roles,
    sequences: list[HarvestSequence],
    batch_size: int,
    device: torch.device,
) -> tuple[float, int, int]:
    """(seconds, recorded positions, all tokens) of the target's forward, batched as the
    harvest batches (prompt-length order)."""
    order = sorted(sequences, key=lambda s: (len(s.prompt.input_ids), s.prompt.prompt_id))
    synchronize(device)
    start = time.perf_counter()
    positions = tokens = 0
    for i in range(0, len(order), batch_size):
        chunk = [s for s in order[i : i + batch_size] if s.region_end > s.region_start]
        if not chunk:
            continue
        ids, mask = pad_right(chunk, device)
        final, _, _ = body(models.target.model, ids, mask)
        rows = torch.cat(
            [torch.full((s.region_end - s.region_start,), j) for j, s in enumerate(chunk)]
        )
        cols = torch.cat([torch.arange(s.region_start - 1, s.region_end - 1) for s in chunk])
        head_logits(models.target.model, final[rows.to(device), cols.to(device)], models.vocab_size)
        positions += len(rows)
        tokens += int(mask.sum())
    synchronize(device)
    return time.perf_counter() - start, positions, tokens


def measure(
    models,
    prompts,
    mixes,
    options,
    batch_size,
    device,
    out_dir: Path,
    generation_batch_size=64,
    statistics_rows=32,
    shared_generation_rows=8,
    *,
    runners: ContinuationRunners,
) -> dict[str, float]:
    synchronize(device)
    start = time.perf_counter()
    batch, sequences = harvest_prompts(
        models,
        prompts,
        mixes,
        options,
        batch_size,
        device,
        None,
        generation_batch_size,
        statistics_rows,
        shared_generation_rows,
        runners=runners,
    )
    for plan in plan_shards(prompts, mixes, len(prompts)):
        write_shard(out_dir, plan, batch, sequences, "benchmark")
    synchronize(device)
    harvest_s = time.perf_counter() - start
    target_s, positions, tokens = target_teacher_forced(models, sequences, batch_size, device)
    assert positions == batch.rows, "one record per recorded position"
    records_per_s = batch.rows / harvest_s
    return {
        "records": batch.rows,
        "harvest_s": harvest_s,
        "records_per_s": records_per_s,
        "target_s": target_s,
        "target_tokens_per_s": positions / target_s,
        "target_all_tokens_per_s": tokens / target_s,
        "all_tokens": tokens,
        "ratio": records_per_s / (positions / target_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="offline_default", help="a conf/models/ option")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each scenario")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides (key=value)")
    args = parser.parse_args()
    cfg = compose_config(
        "stage=harvest",
        f"models={args.models}",
        f"data.num_prompts={args.prompts}",
        *args.overrides,
    )
    set_threads(cfg.get("num_threads"))
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    hcfg = OmegaConf.to_container(cfg.harvest, resolve=True)
    options = HarvestOptions.from_cfg(hcfg, SamplingConfig.from_cfg(cfg.sampling))
    models = load_roles(cfg.models, device, dtype)
    prompts = load_prompts(
        cfg.data, models.tokenizer, options.split, max_context(models, options.positions_per_prompt)
    )
    batch_size = int(hcfg["batch_size"])
    start = time.perf_counter()
    options = resolve_accept(options, models, prompts, int(hcfg["calibration_prompts"]), device)
    calibration_s = time.perf_counter() - start
    # warm-up: first calls allocate and pick kernels; neither side should pay for it
    warm = prompts[:1]
    scenarios = {
        "original": (["original"] * len(prompts), batch_size),
        "all_mixes": (
            assign_mixes([p.prompt_id for p in prompts], options.mix_weights, options.seed),
            int(hcfg["generation_batch_size"]),
        ),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in scenarios}
    # the harvest's runners: its decoding layout, one per model for every repeat, as a
    # harvest's for every shard (a compiled layout compiles in the first repeat)
    runners = ContinuationRunners(
        models, runner_layout(cfg.decoding, device), pack_every=int(cfg.decoding.pack_every)
    )
    with tempfile.TemporaryDirectory() as tmp:  # the warm-up's original mix generates nothing
        measure(models, warm, ["original"], options, batch_size, device, Path(tmp), runners=runners)
        for _ in range(max(1, args.repeats)):
            for name, (mixes, generation) in scenarios.items():
                runs[name].append(
                    measure(
                        models,
                        prompts,
                        mixes,
                        options,
                        batch_size,
                        device,
                        Path(tmp),
                        generation,
                        int(hcfg["statistics_rows"]),
                        shared_rows_of(hcfg),
                        runners=runners,
                    )
                )
    print(
        f"models={args.models} draft={models.draft.name} target={models.target.name} "
        f"prompts={len(prompts)} device={device} threads={torch.get_num_threads()} "
        f"repeats={max(1, args.repeats)} sampling={OmegaConf.to_container(cfg.sampling)}"
    )
    print(
        f"interleaved_accept={options.interleaved_accept} ({hcfg['interleaved_accept']}; "
        f"measured in {calibration_s:.2f} s, once per harvest) "
        f"interleaved_max_run={options.interleaved_max_run}"
    )
    print(
        "scenario  | records | harvest s | records/s | target s | target tok/s (recorded) | "
        "ratio | (all)"
    )
    for name, measured in runs.items():
        for r in measured:
            print(
                f"{name:<9} | {r['records']:>7} | {r['harvest_s']:>9.2f} | "
                f"{r['records_per_s']:>9.1f} | {r['target_s']:>8.2f} | "
                f"{r['target_tokens_per_s']:>23.1f} | {r['ratio']:.3f} | "
                f"{r['target_all_tokens_per_s']:.1f} over {r['all_tokens']} tokens"
            )
    median = {
        name: statistics.median(r["ratio"] for r in measured) for name, measured in runs.items()
    }
    print(f"ratio_original={median['original']:.3f} ratio_all_mixes={median['all_mixes']:.3f}")


if __name__ == "__main__":
    main()
