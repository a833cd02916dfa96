"""Whether the static layout's decode step grows with its capacity: two capacities side by side.

python benchmarks/static_capacity.py                              # offline target, dtype auto
python benchmarks/static_capacity.py --capacities 1024,256 --widths 1,4 --reps 40
python benchmarks/static_capacity.py --models tiny_random --reps 3 device=cpu   # a quick check

The target of `--models` runs in the static layout (`decoding.static_cache=true`; eager unless
an override sets `decoding.compile`) with one cache per capacity (`decoding.static_capacity`),
each primed with the same `--context` tokens of a fixed English text. Each repetition times,
for every capacity in turn (the order reversed every other repetition, so neither always
runs first), one forward of each `--widths` block (1: a decode step; 4: a verify step of
three drafts and the bonus token), each followed, untimed, by a rewind to the context
(truncate and pack), so every timed forward sees the same held tokens. After `--warmup`
untimed repetitions, it prints the median ms per forward of each (capacity, width), the
attention span each forward used, the ratio of the first capacity's medians to the second's
per width, and the load average before and after (a busy machine skews both sides, if
evenly). The last line is `ratio_w<width>=<x> ...` for scripts. `--whole`: every forward
attends over its whole capacity (the span pinned to it), the layout's cost without spans,
for comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from sprinter_train.core.config import compose_config
from sprinter_train.core.runtime import resolve_device, resolve_dtype, set_threads, synchronize
from sprinter_train.decoding.builder import build_runner, runner_layout
from sprinter_train.decoding.cache import static as static_cache
from sprinter_train.decoding.runner.requests import ForwardRequest
from sprinter_train.decoding.runner.runner import ModelRunner
from sprinter_train.models.roles import load_role

TEXT = "The history of the printing press begins in the fifteenth century, when "
FLAGS = ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def prompt_ids(tokenizer, tokens: int) -> list[int]:
    """`tokens` ids of a fixed English text: the same context on every machine."""
    ids: list[int] = []
    while len(ids) < tokens:
        ids += tokenizer(TEXT)["input_ids"]
    return ids[:tokens]


def cpu_flags() -> str:
    """The CPU's model name and which of FLAGS it has (Linux; empty elsewhere)."""
    info = Path("/proc/cpuinfo")
    if not info.exists():
        return ""
    text = info.read_text()
    model = next(
        (ln.split(":", 1)[1].strip() for ln in text.splitlines() if "model name" in ln), ""
    )
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    return f"{model}; " + " ".join(f"{f}={'yes' if f in flags else 'no'}" for f in FLAGS)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Side:
    """One capacity: its runner, its primed cache and its forwards' times by width."""

    def __init__(self, runner: ModelRunner, capacity: int, context: list[int]) -> None:
        self.runner = runner
        self.capacity = capacity
        self.cache = runner.new_cache(1, capacity)
        runner.prime(self.cache, [context])
        self.context = len(context)
        self.held = torch.tensor([self.context])
        self.times: dict[int, list[float]] = {}
        self.spans: dict[int, int] = {}

    def forward(self, width: int, record: bool) -> None:
        """One forward of a `width` block after the context, then the rewind to it."""
        device = self.runner.device
        ids = torch.full((1, width), 42, device=device)
        counts = torch.full((1,), width, device=device)
        keep = torch.arange(width, device=device)[None]
        synchronize(device)
        start = time.perf_counter()
        self.runner.run(self.cache, ForwardRequest(ids, counts, keep))
        synchronize(device)
        elapsed = time.perf_counter() - start
        self.spans[width] = int(getattr(self.cache.kv, "span", self.cache.slots))
        self.cache.truncate(self.held.to(device), self.context)
        self.cache.pack(self.context, self.context)
        if record:
            self.times.setdefault(width, []).append(1e3 * elapsed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="offline_default", help="a conf/models/ option")
    parser.add_argument("--capacities", default="1024,256", help="static capacities compared")
    parser.add_argument("--widths", default="1,4", help="block widths timed (tokens a forward)")
    parser.add_argument("--context", type=int, default=128, help="tokens held before each")
    parser.add_argument("--reps", type=int, default=40, help="timed repetitions")
    parser.add_argument("--warmup", type=int, default=5, help="untimed repetitions first")
    parser.add_argument("--whole", action="store_true", help="attend over whole capacities")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (device=cpu dtype=float32)")
    args = parser.parse_args()
    if args.whole:
        static_cache.attention_span = lambda filled, capacity, coarse=False: capacity
    capacities = [int(c) for c in args.capacities.split(",")]
    widths = [int(w) for w in args.widths.split(",")]
    cfg = compose_config(f"models={args.models}", "decoding.static_cache=true", *args.overrides)
    set_threads(cfg.get("num_threads"))
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    target = load_role(cfg.models, "target", device, dtype)
    vocab = int(target.model.config.vocab_size)
    context = prompt_ids(target.tokenizer, args.context)
    sides = []
    for capacity in capacities:
        layout = runner_layout({**cfg.decoding, "static_capacity": capacity}, device)
        runner = build_runner(target.model, vocab, layout)
        sides.append(Side(runner, capacity, context))
    load_before = load_average()
    with torch.inference_mode():
        for rep in range(args.warmup + args.reps):
            order = sides if rep % 2 == 0 else sides[::-1]
            for side in order:
                for width in widths:
                    side.forward(width, rep >= args.warmup)
    load_after = load_average()
    print(
        f"target {target.name} on {device} ({str(dtype).removeprefix('torch.')}), batch 1, "
        f"{args.context} context tokens, layout {sides[0].runner.layout}, "
        f"threads {torch.get_num_threads()}" + (", whole capacities attended" if args.whole else "")
    )
    print(f"cpu: {cpu_flags()}")
    print(f"load average (1, 5, 15 min): before {load_before}, after {load_after}")
    print(f"medians of {args.reps} interleaved repetitions ({args.warmup} warm-up), ms/forward:")
    for side in sides:
        cells = [
            f"{w} token{'s' if w > 1 else ''}: {statistics.median(side.times[w]):7.2f} "
            f"(span {side.spans[w]})"
            for w in widths
        ]
        print(f"  capacity {side.cache.capacity:5d}: " + "   ".join(cells))
    first, second = sides[0], sides[-1]
    ratios = {
        w: statistics.median(first.times[w]) / statistics.median(second.times[w]) for w in widths
    }
    print(
        f"ratio capacity {first.cache.capacity}/{second.cache.capacity}: "
        + "   ".join(f"{w} token{'s' if w > 1 else ''} {r:.3f}" for w, r in ratios.items())
    )
    print(" ".join(f"ratio_w{w}={r:.3f}" for w, r in ratios.items()))


if __name__ == "__main__":
    main()
