"""Where a batch-1 decode step goes: torch.profiler over the engine's `target_only` (or `sd`).

python benchmarks/profile_step.py --out profile.txt                      # offline pair, auto device
python benchmarks/profile_step.py --models tiny_random --steps 8 --out /tmp/p.txt device=cpu
python benchmarks/profile_step.py --method sd --gamma 3 --out sd.txt     # an sd round's share too

On a GPU the step is launch-bound when the kernels' time is a small share of the step's wall
time (docs/results/gpu.md describes an eager step: the device mostly idle, a thousand kernel
launches and more a step). This writes that diagnosis: the per-step wall time unprofiled (the
median of `--reps` generations of 2 x `--steps` tokens less that of `--steps` tokens, over
`--steps`: the prefill cancels out; after two warm-up generations that also absorb any
compilation and CUDA graph recording, whose seconds are reported), the profiled run's device
time per step, the device's busy share, kernel launches per step, and the top ops by self time;
`--trace` also writes a Chrome trace (chrome://tracing, Perfetto). The target runs in the layout
`decoding.static_cache` / `decoding.compile` / `decoding.static_capacity` give (compiled on CUDA
by default). With `--method sd` the draft runs beside it in the same layout and every figure is
per generated token, not per target step: the GPU bench put an sd round's engine work above its
forwards (docs/results/gpu.md), and this splits that round into device time and host launches.
The last line is `step_ms=<x> busy=<share>` for scripts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from sprinter_train.core.config import compose_config
from sprinter_train.core.runtime import resolve_device, resolve_dtype, set_threads, synchronize
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.decoding.builder import build_engine, runner_layout
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import SpeculativeDecoding, TargetOnly
from sprinter_train.models.roles import load_roles

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cudaGraphLaunch")
TEXT = "The history of the printing press begins in the fifteenth century, when "


def self_device_us(event) -> float:
    """An op's own device time in µs (`self_device_time_total` since torch 2.4)."""
    return float(
        getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0))
    )


def prompt_ids(tokenizer, tokens: int) -> list[int]:
    """`tokens` ids of a fixed English text: the same context on every machine."""
    ids: list[int] = []
    while len(ids) < tokens:
        ids += tokenizer(TEXT)["input_ids"]
    return ids[:tokens]


def timed_steps(
    engine: Engine, policy: Any, prompt: list[int], steps: int, reps: int
) -> list[float]:
    """Milliseconds per generated token of `reps` greedy generations (prefill included once,
    so with many steps it is the decode step's cost)."""
    times = []
    for _ in range(reps):
        synchronize(engine.device)
        start = time.perf_counter()
        engine.generate([prompt], policy, steps, [0])
        synchronize(engine.device)
        times.append(1e3 * (time.perf_counter() - start) / steps)
    return times


def summary(prof, device: torch.device, steps: int, wall_ms: float) -> dict[str, float]:
    """Device time, busy share and kernel launches per step from a profile of `steps` steps."""
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key in LAUNCHES)
    device_ms = sum(self_device_us(e) for e in events) / 1e3 if device.type == "cuda" else None
    return {
        "profiled_ms_per_step": wall_ms / steps,
        "device_ms_per_step": device_ms / steps if device_ms is not None else None,
        "busy_share": device_ms / wall_ms if device_ms is not None and wall_ms > 0 else None,
        "launches_per_step": launches / steps if device.type == "cuda" else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="offline_default", help="a conf/models/ option")
    parser.add_argument("--steps", type=int, default=32, help="decode steps profiled")
    parser.add_argument("--context", type=int, default=100, help="prompt tokens before them")
    parser.add_argument("--reps", type=int, default=3, help="unprofiled timed generations")
    parser.add_argument("--top", type=int, default=25, help="ops listed")
    parser.add_argument("--out", type=Path, default=Path("profile.txt"))
    parser.add_argument("--trace", action="store_true", help="also write <out>.trace.json")
    parser.add_argument("--method", choices=("target_only", "sd"), default="target_only")
    parser.add_argument("--gamma", type=int, default=3, help="sd's drafts a round")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (device=cpu dtype=float32)")
    args = parser.parse_args()
    cfg = compose_config(f"models={args.models}", *args.overrides)
    set_threads(cfg.get("num_threads"))
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    models = load_roles(cfg.models, device, dtype, companion=False)
    policy: Any = TargetOnly()
    if args.method == "sd":
        policy = SpeculativeDecoding(gamma=args.gamma)
    engine = build_engine(
        models.target.model,
        SamplingConfig(0.0),
        models.vocab_size,
        draft=models.draft.model if args.method == "sd" else None,
        layout=runner_layout(cfg.decoding, device),
        pack_every=int(cfg.decoding.pack_every),
    )
    runner, draft = engine.target, engine.draft
    prompt = prompt_ids(models.tokenizer, args.context)

    began = time.perf_counter()
    timed_steps(engine, policy, prompt, 2 * args.steps, 2)  # warm-up: kernels, compilation
    warmup_s = time.perf_counter() - began
    short = statistics.median(timed_steps(engine, policy, prompt, args.steps, args.reps))
    long = statistics.median(timed_steps(engine, policy, prompt, 2 * args.steps, args.reps))
    step_ms = 2 * long - short  # ms/token at 2n and n tokens: (2n*long - n*short) / n
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        wall_ms = args.steps * timed_steps(engine, policy, prompt, args.steps, 1)[0]
    figures = {
        "step_ms": step_ms,
        "ms_per_token_with_prefill": short,
        "warmup_s": warmup_s,
        "compile_s": runner.compile_seconds + (draft.compile_seconds if draft else 0.0),
        **summary(prof, device, args.steps, wall_ms),
    }
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=args.top)
    head = [
        f"target {models.target.name} on {device} ({str(dtype).removeprefix('torch.')}), "
        f"batch 1, {args.context} context tokens, {args.steps} greedy tokens of {args.method}"
        + (f" (gamma {args.gamma}, draft {models.draft.name})" if draft else ""),
        f"layout: static {runner.static}, compiled {runner.compiled}, "
        f"capacity >= {runner.min_capacity}",
        f"step (unprofiled, medians of {args.reps}, prefill cancelled): {step_ms:.2f} ms",
        *(f"{key}: {value:.3f}" for key, value in figures.items() if value is not None),
        "",
    ]
    args.out.write_text("\n".join(head) + table + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n")
    if args.trace:
        prof.export_chrome_trace(str(args.out.with_suffix(".trace.json")))
    busy = figures["busy_share"]
    print(f"step_ms={step_ms:.3f} busy={'n/a' if busy is None else f'{busy:.3f}'}")


if __name__ == "__main__":
    main()
