"""Capture: a static-layout forward replayed as a CUDA graph recorded by hand, one per shape
and cache (`CapturedBackend`, a wrapper around `backends.StaticBackend`).

`torch.compile(mode="reduce-overhead")` replays its graphs as CUDA graphs too, but every call
still walks dynamo's guards and AOTAutograd's and cudagraph-trees' wrappers over all of the
graph's inputs, the model's parameters among them; at the sizes of the models decoded here
that host bookkeeping, not the kernels, sets a step's pace (docs/results/design-figures.md). vLLM
meets the same wall for its drafter and captures it with `torch.cuda.CUDAGraph` itself; so
does this: inductor compiles the step without CUDA graphs (`compiled.compiled_step`), and
`CapturedSteps` records one graph per (input shapes, KV cache, options), whose replay is a
few input copies and one `cudaGraphLaunch`.

What a capture may assume, and how it holds:

- **Static addresses.** The inputs are copied into the graph's own buffers; the keys,
  values, write counters and slot map live in the `SlotMappedKV`, whose buffers never
  move while it lives, and a cache is part of the key (held by the entry, so its id is
  never reused). A cache replaced by a bigger one (`StaticRowCache.reserve`, `select` into
  a new bucket) is a new key; a pooled cache (`KVPool`) comes back with its addresses, so a
  new generation of a known shape replays.
- **State on the device.** The step's writes go to slots counted by each layer's
  `cumulative_length`, a device tensor the graph reads and advances, never a host integer
  frozen at capture; the block's slots are marked in the slot map at that counter, and the
  rows' lengths advanced, in place.
- **Outputs copied out before the next replay.** A replay writes its outputs into the same
  buffers; the backend copies the rows it returns out of them, since the engine may hold a
  forward's outputs past the model's next forward: a round's drafts until its verify. A
  transient request (the target's: it runs once a round and its outputs are read in that
  round) is handed back uncopied.

The first call of a key runs the step itself (the real forward, compiling it: the runner
counts it as compile time), then records the graph without running it; later calls replay.
A shape that cannot be captured keeps running uncaptured, with a warning.

A captured graph holds more than the body (`CapturedBackend.record`): the block's position
ids and mask with their bookkeeping, the outputs at the kept offsets, the head, the
broken-logits watch, the sampling's warp and what the engine does with it (`after_warp`: the
draft's and the target's draw, the verify's speculative check), so that little of a round is
left to host ops outside the graphs (`benchmarks/host_ops.py --captured` counts them). A
draft round of fixed length is one graph of all its steps (`record_round`,
through the same `CapturedSteps`), so its steps need no host op between them.

A draft round of fixed length in one captured graph: the gamma draft steps (the forward,
the warp, the draw and the step's bookkeeping) recorded together, one graph per (row bucket,
first block's width, gamma, cache, attention span), so a round of `sd` replays two graphs,
the draft round and the target's verify, with no host op between its draft steps.

A step's host work in the per-step loop (`policies.base.draft_round`) is what the graph holds
here: the next block is the step's own drawn token, the rows still drafting are
`active & (drafted < limit)`, and step j of row r draws at the row's next number after the
ones its earlier steps took (u[r, drafted[r]] of the round's `RowStreams.peek(gamma)`), so
the tokens are the loop's, bit for bit. What the graph keeps is what the verify reads: the
drafts, their laws on the vocabulary and each row's count (`state.Round.drafts`).

Only a round whose length is fixed before its first draft takes this path (`fixed_round`:
`sd`, `sd_heuristic`). Policies that stop drafting per token (`svip`, `adaedl`, `sv`,
`sd_learned`, `sprinter`, the oracle and the online rules) decide on the host after each
step, from the step's outputs, and keep the per-step graphs.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sprinter_train.core.sampling import warp_probs
from sprinter_train.decoding.batch import spread
from sprinter_train.decoding.cache.static import StaticRowCache
from sprinter_train.decoding.runner.after_warp import Draw
from sprinter_train.decoding.runner.backends import Backend, StaticBackend
from sprinter_train.decoding.runner.requests import (
    ForwardRequest,
    Recorded,
    RoundPlan,
    RoundRequest,
    RowOutput,
)

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
    `capture` hands back output buffers and leaves `state` (a `SlotMappedKV`) as it was: it
    runs the step, then puts back every buffer it writes (`written`: the keys, values, write
    counters and slot map); `replay` runs the step on the graph's input buffers and writes
    into those same output buffers, so a caller that kept an output past the next replay
    reads the new values, as on a GPU."""

    replays = 0  # across instances: what a test or a count reads

    def __init__(self, pool: Any) -> None:
        self.run: Callable[[], Any] | None = None
        self.outputs: tuple[torch.Tensor, ...] = ()

    def capture(self, run: Callable[[], Any], state: Any) -> Any:
        """Run the step once for its output buffers, then put `state` back, also when the
        step fails mid-way (a block past the capacity has marked slots by then): a CUDA
        graph that fails to record has run nothing either."""
        written = state.written
        saved = [t.clone() for t in written]
        self.run = run
        try:
            made, buffers = run(), {}
            for t in made:  # one buffer per output tensor, as a CUDA graph has
                buffers.setdefault(id(t), t.clone())
            self.outputs = tuple(buffers[id(t)] for t in made)
        finally:
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


class CapturedBackend(Backend):
    """A `StaticBackend` whose forwards replay from graphs captured by hand (`CapturedSteps`):
    the same caches, shapes and compile accounting, the same arithmetic (`record` is the
    static backend's own `forward` plus the warp and `then`), run as one graph a forward.
    A graph records one attention span (part of its key), so a captured layout's spans are
    coarse, powers of two (`RunnerLayout.coarse_spans`, set with `captured` by the builder):
    the wrapped backend is used as it was built, never reconfigured."""

    def __init__(self, static: StaticBackend) -> None:
        super().__init__(static.model, static.head, static.hidden_layer, static.clock, static.watch)
        assert static.layout.captured and static.coarse_spans, "a captured layout's backend"
        self.static = static
        self.prefills = static.prefills
        self.name = ("compiled" if static.compiled else "static") + ":captured"
        self.graphs = CapturedSteps(self.record)
        static.watch.arm()  # the scalar the graphs fold the broken-logits watch into

    def new_cache(self, rows: int, capacity: int = 0) -> StaticRowCache:
        return self.static.new_cache(rows, capacity)

    def compile_work(self) -> tuple[int, int]:
        return self.static.compile_work()[0], self.graphs.captures

    def prefill(self, cache: StaticRowCache, ids: torch.Tensor, lengths: list[int]) -> None:
        """Uncaptured (`StaticBackend.prefill`): a graph a prompt width would be one capture
        per prompt length."""
        self.static.prefill(cache, ids, lengths)

    def run(self, cache: StaticRowCache, request: ForwardRequest) -> RowOutput:
        ids, compiling = self.static.prepare(cache, request)
        with self.clock.timed((request.rows, request.width), compiling):
            logits, hidden, picked, *warped = self._replayed(cache, ids, request)
            cache.append(request.counts, request.width)
        then = request.after_warp
        support = self.head.support if request.restricted else None
        out = RowOutput(logits, hidden, support, picked, *warped[:1])
        if then is not None:
            for name, value in zip(then.recorded.fields, warped[1:], strict=True):
                setattr(out, name, value)
        return out

    def run_round(
        self, cache: StaticRowCache, request: RoundRequest
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A draft round in one graph (`record_round`): (drafts, their laws,
        drafts a row), handed back uncopied: the verify reads them before the next round."""
        more = request.gamma - 1
        ids, compiling = self.static.prepare(cache, request, more)
        with self.clock.timed((request.rows, 1), compiling, request.gamma):
            self.watch.replayed = True
            outputs = self.graphs(
                ids,
                cache.pad_rows(request.plan),
                cache.pad_rows(request.u),
                kv=cache.kv,
                recorded=RoundPlan(request.warp, request.gamma),
                span=cache.kv.span,
            )
            cache.append(request.plan, request.width + more)
        if request.rows == cache.bucket:
            return outputs
        return tuple(t[: request.rows] for t in outputs)

    def _replayed(
        self, cache: StaticRowCache, ids: torch.Tensor, request: ForwardRequest
    ) -> tuple[torch.Tensor, ...]:
        """`record` over the padded block, replayed from its graph: a replay overwrites its
        outputs, so the rows kept are copied out unless the request is `transient`."""
        self.watch.replayed = True
        then = request.after_warp
        extra = () if then is None else tuple(cache.pad_rows(t) for t in then.tensors)
        outputs = self.graphs(
            ids,
            cache.pad_rows(request.keep),
            cache.pad_rows(request.counts),
            *extra,
            kv=cache.kv,
            recorded=Recorded.of(request),
            span=cache.kv.span,
        )
        rows, copies = request.rows, {}
        if request.transient:
            return outputs if rows == cache.bucket else tuple(t[:rows] for t in outputs)
        # a scored draft step's logits and hidden states are read before the next forward
        # only (its score was computed from them in the graph): handed back as views
        lasting = getattr(then, "lasting", None)
        after = () if then is None else then.recorded.fields
        names = ("logits", "hidden", "picked", *(("probs", *after) if request.warp else ()))
        for name, t in zip(names, outputs, strict=True):
            if lasting is not None and name not in lasting:
                copies.setdefault(id(t), t if rows == cache.bucket else t[:rows])
            elif id(t) not in copies:  # an output returned twice (hidden layer -1) copied once
                copies[id(t)] = t[:rows].clone()
        return tuple(copies[id(t)] for t in outputs)

    def record(
        self, *inputs: torch.Tensor, kv: Any, recorded: Recorded | RoundPlan, span: int
    ) -> tuple[torch.Tensor, ...]:
        """What a graph records: one forward (`record_forward`) or a whole draft round
        (`record_round`)."""
        if isinstance(recorded, RoundPlan):
            return record_round(self, *inputs, kv=kv, recorded=recorded, span=span)
        return self.record_forward(*inputs, kv=kv, recorded=recorded, span=span)

    def record_forward(
        self,
        ids: torch.Tensor,
        keep: torch.Tensor,
        counts: torch.Tensor,
        *extra: torch.Tensor,
        kv: Any,
        recorded: Recorded,
        span: int,
    ) -> tuple[torch.Tensor, ...]:
        """What a forward's graph records, over the row bucket and attending over `span` slots:
        the block's position ids and mask, recorded in the cache's slot map
        (`SlotMappedKV.block`), the static backend's own forward (the body, the outputs at
        the kept offsets, the head: `StaticBackend.forward`), the warped laws when the request warps (row by row, so the inert rows change
        nothing), `then`'s work over them on its tensors `extra` (inert rows check
        nothing) and the lowest broken position, folded into the watch's scalar (inert
        rows feed nothing, so they never count as broken)."""
        kv.span = span
        positions, mask = kv.block(counts, ids.shape[1])
        logits, hidden, picked, _ = self.static.forward(
            ids, positions, mask, kv, keep, recorded.restricted
        )
        warped: tuple[torch.Tensor, ...] = ()
        if recorded.warp is not None:
            probs = warp_probs(logits, recorded.warp)
            then = recorded.then
            if then is None:
                warped = (probs,)
            elif then.reads_forward:  # a scorer: the step's raw logits and hidden state too
                warped = (probs, *then.apply(probs, logits, hidden, *extra))
            else:
                warped = (probs, *then.apply(probs, *extra))
        self.watch.fold(logits, positions, keep, counts)
        return logits, hidden, picked, *warped


def record_round(
    backend: CapturedBackend,
    ids: torch.Tensor,
    plan: torch.Tensor,
    u: torch.Tensor,
    kv: Any,
    recorded: RoundPlan,
    span: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a draft round's graph records over the row bucket: `recorded.gamma` steps of the
    per-step loop, each what a step's own graph records (`record_forward`: the static
    forward on the restricted head, its warp, the draw and the broken-logits watch), then
    the loop's bookkeeping; (drafts (rows, G), their laws (rows, G, V), drafts a row)."""
    head = backend.head
    step = Recorded(restricted=True, warp=recorded.warp, then=Draw)
    limit = plan[:, 2]
    active = limit > 0
    counts, keep, block = plan[:, 0] * active, plan[:, 1:2], ids
    drafted = torch.zeros_like(limit)
    tokens, laws = [], []
    for _ in range(recorded.gamma):
        drawn_at = u.gather(1, drafted[:, None])[:, 0]
        _, _, _, probs, drawn = backend.record_forward(
            block, keep, counts, drawn_at, kv=kv, recorded=step, span=span
        )
        token = drawn if head.support is None else head.support[drawn]
        tokens.append(token)
        laws.append(probs[:, 0])
        drafted = drafted + active
        active = active & (drafted < limit)
        block, counts, keep = token[:, None], active.long(), torch.zeros_like(keep)
    probs = torch.stack(laws, 1)
    if head.support is not None:
        probs = spread(probs, head.support, head.vocab_size, 0.0)
    return torch.stack(tokens, 1), probs, drafted
