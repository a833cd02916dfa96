"""A static-layout forward replayed as a CUDA graph captured by hand, one per shape and cache.

`torch.compile(mode="reduce-overhead")` replays its graphs as CUDA graphs too, but every call
still walks dynamo's guards and AOTAutograd's and cudagraph-trees' wrappers over all of the
graph's inputs, the model's parameters among them. On the H100 of session 16 (profile of a
greedy sd round, 135M target and 2-layer draft, bf16, batch 1) that bookkeeping cost 1.47 ms
of host time a target verify (272 parameter tensors) and 0.28-0.40 ms a draft step (23),
against 1.7 ms and 0.09 ms of device time: at these model sizes the wrappers, not the
kernels, set the step's pace. vLLM meets the same wall for its drafter and captures it with
`torch.cuda.CUDAGraph` itself; so does this: inductor compiles the step without CUDA graphs
(`runner.compiled_step`), and `CapturedSteps` records one graph per (input shapes, KV cache,
options), whose replay is a few input copies and one `cudaGraphLaunch`. Measured on that
H100: a batch-1 target step of 2.10 ms against 2.56 with `reduce-overhead`, an sd token
3.38 against 4.08 ms (docs/results/gpu.md, session 16).

What a capture may assume, and how it holds:

- **Static addresses.** The inputs are copied into the graph's own buffers; the keys,
  values, write counters and slot map live in the `RowStaticCache`, whose buffers never
  move while it lives, and a cache is part of the key (held by the entry, so its id is
  never reused). A cache replaced by a bigger one (`StaticRowCache.reserve`, `select` into
  a new bucket) is a new key; a pooled cache (`KVPool`) comes back with its addresses, so a
  new generation of a known shape replays.
- **State on the device.** The step's writes go to slots counted by each layer's
  `cumulative_length`, a device tensor the graph reads and advances, never a host integer
  frozen at capture; the block's slots are marked in the slot map at that counter, and the
  rows' lengths advanced, in place.
- **Outputs copied out before the next replay.** A replay writes its outputs into the same
  buffers; the runner copies the rows it returns out of them (`ModelRunner._replayed`),
  since the engine may hold a forward's outputs past the model's next forward: a round's
  drafts until its verify. The target's are the exception (`transient`): it runs once a
  round and its outputs are read in that round, so they are handed back uncopied.

The first call of a key runs the step itself (the real forward, compiling it: the runner
counts it as compile time), then records the graph without running it; later calls replay.
A shape that cannot be captured keeps running uncaptured, with a warning.

The runner captures more than the body (`ModelRunner._captured_forward`): the block's
position ids and mask with their bookkeeping, the outputs at the kept offsets, the head, the
broken-logits watch, the sampling's warp and what the engine does with it (`after_warp`: the
draft's and the target's draw, the verify's speculative check) replay in the same graph
(`benchmarks/host_ops.py --captured`: 49.5 host ops a target-only step and 174 an sd round,
against 100.5 and 417 uncaptured; 74.6 and 332 captured before the bookkeeping, the draws
and the check moved in and the target's outputs stopped being copied).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

Step = Callable[..., tuple[torch.Tensor, ...]]


class CudaGraph:
    """`torch.cuda.CUDAGraph` behind the two calls `CapturedSteps` makes. A CPU test swaps in
    a stand-in with the same contract: `capture` records without running (a stand-in that does
    run must put `state`, what the step writes, back as it was), `replay` runs."""

    def __init__(self, pool: Any) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool

    def capture(self, run: Callable[[], Any], state: Any) -> Any:
        with torch.cuda.graph(self.graph, pool=self.pool):
            return run()

    def replay(self) -> None:
        self.graph.replay()


class HostGraph:
    """A CUDA graph's contract played on the host, where no CUDA graph exists: for the CPU
    tests and for counting the host ops a captured engine leaves (benchmarks/host_ops.py).
    `capture` hands back output buffers and leaves `state` (a `RowStaticCache`) as it was: it
    runs the step, then puts back every buffer it writes (`written`: the keys, values, write
    counters and slot map); `replay` runs the step on the graph's input buffers and writes
    into those same output buffers, so a caller that kept an output past the next replay
    reads the new values, as on a GPU."""

    replays = 0  # across instances: what a test or a count reads

    def __init__(self, pool: Any) -> None:
        self.run: Callable[[], Any] | None = None
        self.outputs: tuple[torch.Tensor, ...] = ()

    def capture(self, run: Callable[[], Any], state: Any) -> Any:
        written = state.written
        saved = [t.clone() for t in written]
        self.run = run
        made, buffers = run(), {}
        for t in made:  # one buffer per output tensor, as a CUDA graph has
            buffers.setdefault(id(t), t.clone())
        self.outputs = tuple(buffers[id(t)] for t in made)
        with torch.inference_mode():
            for buffer, was in zip(written, saved, strict=True):
                buffer.copy_(was)
        return self.outputs

    def replay(self) -> None:
        assert self.run is not None
        HostGraph.replays += 1
        for buffer, value in zip(self.outputs, self.run(), strict=True):
            buffer.copy_(value)


@dataclass
class _Captured:
    graph: Any
    inputs: tuple[torch.Tensor, ...]  # the graph's own input buffers
    outputs: tuple[torch.Tensor, ...]  # written by every replay
    kv: Any  # held, so the cache's id names it for the entry's life


class CapturedSteps:
    """`step(*inputs, kv=kv, **options)` replayed from one captured graph per (the inputs'
    shapes and dtypes, `kv`, `options`: plain values a capture freezes); `keep` graphs at
    most (the least recently used leaves first). `new_graph(pool)` makes a graph (`CudaGraph`
    on a GPU); all of a runner's graphs share one memory pool, safe since each keeps its
    outputs alive and a replay overwrites only its own dead intermediates."""

    def __init__(
        self, step: Step, new_graph: Callable[[Any], Any] | None = None, keep: int = 64
    ) -> None:
        self.step = step
        self.new_graph = CudaGraph if new_graph is None else new_graph
        self.keep = keep
        self.captures = 0  # graphs recorded (each a first call: compile time, not a forward)
        self._pool: Any = None
        self._graphs: OrderedDict[tuple, _Captured | None] = OrderedDict()

    def __call__(self, *inputs: torch.Tensor, kv: Any, **options: Any) -> tuple[torch.Tensor, ...]:
        shapes = tuple((t.shape, t.dtype) for t in inputs)
        key = (shapes, inputs[0].device, id(kv), tuple(sorted(options.items())))
        if key not in self._graphs:
            outputs = self.step(*inputs, kv=kv, **options)
            self._graphs[key] = self._capture(inputs, kv, options)
            self._forget()
            return outputs
        self._graphs.move_to_end(key)
        entry = self._graphs[key]
        if entry is None:  # could not be captured
            return self.step(*inputs, kv=kv, **options)
        for buffer, value in zip(entry.inputs, inputs, strict=True):
            buffer.copy_(value)
        entry.graph.replay()
        return entry.outputs

    def _capture(
        self, inputs: tuple[torch.Tensor, ...], kv: Any, options: dict[str, Any]
    ) -> _Captured | None:
        """Record the step on copies of `inputs` (nothing runs: the cache is untouched)."""
        if self._pool is None and inputs[0].device.type == "cuda":
            self._pool = torch.cuda.graph_pool_handle()
        buffers = tuple(value.clone() for value in inputs)
        graph = self.new_graph(self._pool)
        try:
            outputs = graph.capture(lambda: self.step(*buffers, kv=kv, **options), kv)
        except Exception as error:  # noqa: BLE001  # an uncapturable op: run it uncaptured
            log.warning("a forward of shape %s runs uncaptured: %s", tuple(inputs[0].shape), error)
            return None
        self.captures += 1
        return _Captured(graph, buffers, tuple(outputs), kv)

    def _forget(self) -> None:
        while len(self._graphs) > self.keep:
            self._graphs.popitem(last=False)

    def __len__(self) -> int:
        return sum(entry is not None for entry in self._graphs.values())
