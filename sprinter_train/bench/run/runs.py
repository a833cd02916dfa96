"""The bench's decoding runs: every method on the same prompts, one batch size at a time.

Prompts are taken in consecutive groups of the batch size (the last group may be smaller);
within a group every method runs in turn, so machine noise hits all alike (and when a batch
size leaves few groups, each is decoded several times and keeps its median run). Prompt i is
decoded with seed + i whatever its group, so at temperature 0, or for methods whose rows
ignore their batch-mates, a row's tokens are the same at every batch size. Each method is
warmed up on the first group first (caches, allocator, the kernels of that batch's shapes).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from sprinter_train.bench.timing.energy import EnergyMeter
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.batch import DecodeStats, Policy
from sprinter_train.decoding.engine import Engine

log = logging.getLogger(__name__)

Decoded = tuple[list[list[int]], float, DecodeStats]  # rows' tokens, group's seconds, counts
Decode = Callable[[str, Sequence[Prompt], Sequence[int]], Decoded]  # (method, prompts, seeds)


@dataclass
class GroupRun:
    """One method on one group of prompts decoded together."""

    prompts: list[Prompt]
    tokens: list[list[int]]  # generated ids per row, without the prompt
    wall_s: float  # the whole group's
    stats: DecodeStats  # the whole group's
    joules: float | None = None
    energy_reason: str | None = "disabled"  # why joules is None (None when measured)


def engine_decode(engine: Engine, policies: dict[str, Policy], max_new_tokens: int) -> Decode:
    """Decode a group with the engine as one batch."""

    def decode(name: str, prompts: Sequence[Prompt], seeds: Sequence[int]) -> Decoded:
        ids = [p.input_ids for p in prompts]
        results = engine.generate(ids, policies[name], max_new_tokens, seeds)
        return [r.tokens for r in results], results[0].wall_s, results[0].stats

    return decode


def groups(count: int, batch_size: int) -> list[range]:
    """Indices of consecutive groups of `batch_size` prompts."""
    return [range(i, min(i + batch_size, count)) for i in range(0, count, batch_size)]


def run_methods(
    decode: Decode,
    names: Sequence[str],
    prompts: Sequence[Prompt],
    batch_size: int,
    seed: int,
    warmup_runs: int,
    energy_device: torch.device | None = None,
    min_timed_runs: int = 1,
    warmup_s: dict[str, float] | None = None,
    warm_up: Callable[[str], AbstractContextManager[Any]] | None = None,
) -> dict[str, list[GroupRun]]:
    """Every method on every group, methods interleaved per group; energy metered per group
    when `energy_device` is given; each method's warm-up seconds (compilation included: they
    are never in its tokens/s) written into `warmup_s` when given, and its warm-up run
    inside `warm_up(method)` when given (`bench.phases.phase`: what it compiled).

    With fewer groups than `min_timed_runs` (a batch size near the prompt count leaves one
    or two), the groups are decoded again until each method has that many timed runs, the
    method order rotating each pass, and each group keeps its run of median time: one group
    timed once, on a shared machine, read a third slower for the same work."""
    chunks = groups(len(prompts), batch_size)
    passes = max(1, -(-int(min_timed_runs) // len(chunks)))
    first = [prompts[i] for i in chunks[0]]
    for name in names:
        start = time.perf_counter()
        with nullcontext() if warm_up is None else warm_up(name):
            for run in range(warmup_runs):
                decode(name, first, [seed + run + i for i in range(len(first))])
        elapsed = time.perf_counter() - start
        # a GPU's first calls compile and capture for tens of seconds: say so as it goes, so
        # a run cut short shows where its time went
        log.info("bench: %s warmed up at batch %d in %.1f s", name, batch_size, elapsed)
        if warmup_s is not None:
            warmup_s[name] = elapsed
    runs: dict[str, list[GroupRun]] = {name: [] for name in names}
    label = f"bench batch {batch_size}" + (f" ({passes} passes)" if passes > 1 else "")
    for chunk in tqdm(chunks, desc=label, unit="group"):
        group = [prompts[i] for i in chunk]
        seeds = [seed + i for i in chunk]
        timed: dict[str, list[GroupRun]] = {name: [] for name in names}
        for rep in range(passes):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                meter = EnergyMeter(energy_device) if energy_device is not None else None
                if meter:
                    meter.start()
                tokens, wall, stats = decode(name, group, seeds)
                joules = meter.stop() if meter else None
                reason = meter.unavailable_reason if meter else "disabled"
                timed[name].append(GroupRun(group, tokens, wall, stats, joules, reason))
        for name, tries in timed.items():
            runs[name].append(sorted(tries, key=lambda r: r.wall_s)[(len(tries) - 1) // 2])
    return runs
