"""Median ms of the target's KV-cached forward through `ModelRunner` by block width, in the
dynamic layout, the static layout (eager) and the static layout compiled (decoding.compile).

`stage=draft_eval` times raw Hugging Face forwards over a `DynamicCache`; this times the
engine's own forward, the one `decoding.static_cache` / `decoding.compile` change.
Usage: python benchmarks/static_forward_ms.py [rows=1] [context=128] [widths=1,2,3,4,7] [reps=10]
    [layouts=dynamic,static,compiled] [capacity=0]
`capacity`: the slots a static cache holds at least (`decoding.static_capacity`): a static
forward attends over the span of its filled slots (`static_cache.attention_span`), the
dynamic one over the held slots.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from sprinter_train.core.config import compose_config
from sprinter_train.core.runtime import resolve_device, resolve_dtype
from sprinter_train.decoding.builder import build_runner, runner_layout
from sprinter_train.decoding.runner.requests import ForwardRequest
from sprinter_train.decoding.runner.runner import ModelRunner
from sprinter_train.models.roles import load_role, model_specs


def forward_ms(runner: ModelRunner, rows: int, context: int, widths: list[int], reps: int):
    """{width: median ms} of `reps` forwards after one untimed call per width (warm-up and,
    when compiled, compile), each from the same `context` held tokens."""
    vocab = runner.vocab_size
    gen = torch.Generator().manual_seed(0)
    cache = runner.new_cache(rows, context + max(widths) + 16)
    runner.prime(cache, torch.randint(0, vocab, (rows, context), generator=gen).tolist())
    held = torch.full((rows,), context)
    out = {}
    for width in widths:
        ids = torch.randint(0, vocab, (rows, width), generator=gen)
        counts = torch.full((rows,), width)
        keep = torch.arange(width).expand(rows, -1)
        times = []
        for rep in range(reps + 1):
            start = time.perf_counter()
            runner.run(cache, ForwardRequest(ids, counts, keep))
            if rep:
                times.append(time.perf_counter() - start)
            cache.truncate(held, context)
            cache.pack(context, context)
        out[width] = round(statistics.median(times) * 1e3, 2)
    kv = getattr(cache, "kv", None)
    out["slots"] = getattr(kv, "span", cache.slots)  # what the last forward attended over
    return out


def main() -> None:
    args = dict(a.split("=") for a in sys.argv[1:])
    rows, context = int(args.get("rows", 1)), int(args.get("context", 128))
    widths = [int(w) for w in args.get("widths", "1,2,3,4,7").split(",")]
    reps = int(args.get("reps", 10))
    layouts = args.get("layouts", "dynamic,static,compiled").split(",")
    capacity = int(args.get("capacity", 0))
    cfg = compose_config()
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    target = load_role(model_specs(cfg.models), "target", device, dtype)
    vocab = int(target.model.config.vocab_size)
    # the config's own layout (its compile cache among it), the static and compile switches
    # set per variant
    static = {**cfg.decoding, "static_cache": True, "static_capacity": capacity}
    for name, layout in {
        "dynamic": {"prefill_tokens": int(cfg.decoding.prefill_tokens)},
        "static": runner_layout({**static, "compile": False}, device),
        "compiled": runner_layout({**static, "compile": True}, device),
    }.items():
        if name not in layouts:
            continue
        runner = build_runner(target.model, vocab, layout)
        ms = forward_ms(runner, rows, context, widths, reps)
        print(
            name,
            dtype,
            f"rows={rows}",
            ms,
            f"compile_s={runner.compile_seconds:.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
