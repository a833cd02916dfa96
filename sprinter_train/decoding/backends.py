"""One backend per cache layout, each running a `ForwardRequest` over its own kind of cache.

- `DynamicBackend`: the model's own forward over a `DynamicRowCache` (the reference layout:
  full-vocabulary logits even for a restricted head).
- `LeanBackend`: the distilled draft through `models.lean.LeanDraft` over the lean buffers
  (the same arithmetic without Hugging Face's per-step mask and cache machinery).
- `StaticBackend`: the model's body at a few static shapes over a `StaticRowCache`, run
  eagerly or through `torch.compile` (`compiled_step`), one graph per (row bucket, width,
  capacity), attending over the filled slots' span only (`static_cache.attention_span`).

`ModelRunner` picks one from its settings when it is built; capture wraps the static one
(`graphs.CapturedBackend`) rather than branching inside it.
"""

from __future__ import annotations

from typing import Any

import torch

from sprinter_train.core.compile_cache import step_of_its_own
from sprinter_train.decoding.cache import DynamicRowCache
from sprinter_train.decoding.clock import ForwardClock
from sprinter_train.decoding.forward import BrokenWatch, ForwardRequest, Head, RowOutput, pick
from sprinter_train.decoding.static_cache import KVPool, StaticRowCache
from sprinter_train.models.body import body
from sprinter_train.models.cache import cache_kwarg
from sprinter_train.models.lean import LeanDraft, StaticKV


class Backend:
    """What every layout shares: the model, its head, which hidden state verifiers read
    (`hidden_layer`), the runner's clock and broken-logits watch."""

    name = "dynamic"
    prefills = False  # fills an empty cache through `prefill` (one group of prompts)

    def __init__(
        self,
        model: torch.nn.Module,
        head: Head,
        hidden_layer: int,
        clock: ForwardClock,
        watch: BrokenWatch,
    ) -> None:
        self.model = model
        self.head = head
        self.hidden_layer = hidden_layer
        self.clock = clock
        self.watch = watch
        self.device = next(model.parameters()).device

    def new_cache(self, rows: int, capacity: int = 0) -> Any:
        raise NotImplementedError

    def run(self, cache: Any, request: ForwardRequest) -> RowOutput:
        raise NotImplementedError

    def compile_work(self) -> tuple[int, int]:
        """(graphs dynamo compiled for this backend, CUDA graphs it captured) so far."""
        return 0, 0

    def prefill(self, cache: Any, ids: torch.Tensor, lengths: list[int]) -> None:
        """Fill an empty cache with the right-padded prompts `ids` in one forward (where
        `prefills`)."""
        raise NotImplementedError


class DynamicBackend(Backend):
    """The model's own forward over a `DynamicRowCache`."""

    def new_cache(self, rows: int, capacity: int = 0) -> DynamicRowCache:
        return DynamicRowCache(rows, self.device)

    def run(self, cache: DynamicRowCache, request: ForwardRequest) -> RowOutput:
        ids, counts, keep, width = request.ids, request.counts, request.keep, request.width
        positions, mask = cache.block(counts, width)
        with self.clock.timed((request.rows, width)):
            final, chosen, kv = body(
                self.model,
                ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache.kv,
                hidden_layer=self.hidden_layer,
                use_cache=True,
            )
            cache.kv = kv  # a forward may hand back another cache object
            cache.append(counts, width)
            picked, hidden = pick(final, chosen, keep, width, self.hidden_layer == -1)
            logits = self.head.full(picked)  # the reference layout: the full vocabulary
        self.watch.see(logits, positions, keep, counts)
        return RowOutput(logits, hidden, final=picked)


class LeanBackend(Backend):
    """The distilled draft through `LeanDraft`: the cache's own slot marks are the mask, and
    a one-token step (every drafting step but a round's first) skips the gathers."""

    name = "lean"

    def __init__(self, lean: LeanDraft, *args: Any) -> None:
        super().__init__(*args)
        self.lean = lean

    def new_cache(self, rows: int, capacity: int = 0) -> DynamicRowCache:
        return DynamicRowCache(rows, self.device, StaticKV())

    def run(self, cache: DynamicRowCache, request: ForwardRequest) -> RowOutput:
        ids, counts, keep, width = request.ids, request.counts, request.keep, request.width
        positions = cache.lengths[:, None]
        if width > 1:
            positions = positions + torch.arange(width, device=self.device)
        with self.clock.timed((request.rows, width)):
            final, chosen = self.lean.forward(
                ids, positions, cache.position >= 0, cache.kv, self.hidden_layer
            )
            cache.append(counts, width)
            if width == 1 and keep.shape[1] == 1:  # keep is clamped to the only offset
                picked, hidden = final, chosen
            else:
                picked, hidden = pick(final, chosen, keep, width, self.hidden_layer == -1)
            logits, support = self.head.logits(picked, request.restricted)
        self.watch.see(logits, positions, keep, counts)
        return RowOutput(logits, hidden, support, picked)


class StaticBackend(Backend):
    """The body at static shapes over a `StaticRowCache`: the block and the mask padded to
    the cache's row bucket and capacity, the inert rows' outputs dropped, the attention cut
    to the span of the filled slots (`StaticRowCache.attend`; `coarse_spans`: powers of two,
    fewer shapes). `compiled`: `step` is `body_step` under `compiled_step` (`cudagraphs`:
    with `reduce-overhead` on CUDA). Caches start with at least `min_capacity` slots (fewer
    shapes), take their buffers from `pool`, and keep their row bucket as rows leave unless
    `shrink_rows`."""

    def __init__(
        self,
        *args: Any,
        compiled: bool = False,
        cudagraphs: bool = True,
        min_capacity: int = 0,
        pool: KVPool | None = None,
        shrink_rows: bool = True,
    ) -> None:
        super().__init__(*args)
        self.compiled = compiled
        self.name = "static"
        if compiled:
            self.name = "compiled:" + ("cudagraphs" if self.device.type == "cuda" else "packed")
        self.step: Any = self.body_step
        # under `reduce-overhead` every prompt width would record a CUDA graph of its own
        self.prefills = not (compiled and cudagraphs and self.device.type == "cuda")
        if compiled:
            own = step_of_its_own(self.body_step, shape_owner(self.model, self.hidden_layer))
            self.step = compiled_step(own, self.device, cudagraphs)
        self.min_capacity = min_capacity
        self.pool = KVPool() if pool is None else pool
        self.shrink_rows = shrink_rows
        self.coarse_spans = False
        # resolved here, not in the traced step: see `models.body.body`'s `cache_name`
        self.cache_name = cache_kwarg(self.model.base_model)
        self._shapes_seen: set[tuple[int, int, int, int]] = set()

    def new_cache(self, rows: int, capacity: int = 0) -> StaticRowCache:
        return StaticRowCache(
            rows,
            self.device,
            self.model,
            max(capacity, self.min_capacity),
            pool=self.pool,
            shrink=self.shrink_rows,
        )

    def compile_work(self) -> tuple[int, int]:
        return (compiled_graphs() if self.compiled else 0), 0

    def body_step(
        self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, kv: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The body over one static-shape block (what `compiled` compiles)."""
        final, chosen, _ = body(
            self.model,
            ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=kv,
            hidden_layer=self.hidden_layer,
            use_cache=True,
            cache_name=self.cache_name,
        )
        return final, chosen

    def prefill(self, cache: StaticRowCache, ids: torch.Tensor, lengths: list[int]) -> None:
        """Fill an empty cache with one block of every row's prompt, right-padded to the
        longest (`lengths` real tokens a row; the slots past them left empty), through
        `step`: the decode's own body, compiled where it is, one graph for any width past
        one, instead of the model's own eager forward and a copy into the buffers. Only where
        `prefills`: not through CUDA graphs `torch.compile` records per shape."""
        width = ids.shape[1]
        cache.reserve(width)
        cache.attend(width, self.coarse_spans)
        counts = torch.as_tensor(lengths, device=self.device)
        positions, mask = cache.block(counts, width)
        ids = cache.pad_rows(ids)
        if width > 1:  # symbolic from the first prompt on: one graph for every width past one
            torch._dynamo.maybe_mark_dynamic(ids, 1)
            torch._dynamo.maybe_mark_dynamic(positions, 1)
        self.step(ids, positions, mask, cache.kv)
        cache.append(counts, width)
        cache.settled = min(lengths)

    def prepare(
        self, cache: StaticRowCache, request: ForwardRequest, more: int = 0
    ) -> tuple[torch.Tensor, bool]:
        """Make room for the block and set the span it attends over; (ids padded to the row
        bucket, whether this shape is new to a compiled step: its first call is compile
        time). `more`: one-token blocks the same call appends after it (a draft round in one
        graph), within the same room and span."""
        width = request.width
        cache.reserve(width + more)
        span = cache.attend(width + more, self.coarse_spans)
        keys = {(cache.bucket, w, cache.capacity, span) for w in {width, 1 if more else width}}
        compiling = self.compiled and not keys <= self._shapes_seen
        self._shapes_seen |= keys
        ids = cache.pad_rows(request.ids)
        if self.compiled and not ids.is_inference():
            # dynamo guards on a tensor's dispatch keys: an input made outside inference mode
            # (the engine's) against one made inside (the latency profile's) would recompile
            # every shape, its time hidden in the forwards'
            ids = ids.clone()
        return ids, compiling

    def run(self, cache: StaticRowCache, request: ForwardRequest) -> RowOutput:
        ids, compiling = self.prepare(cache, request)
        rows, width, counts, keep = request.rows, request.width, request.counts, request.keep
        with self.clock.timed((rows, width), compiling):
            positions, mask = cache.block(counts, width)
            final, chosen = self.step(ids, positions, mask, cache.kv)
            final, chosen = final[:rows], chosen[:rows]
            picked, hidden = pick(final, chosen, keep, width, self.hidden_layer == -1)
            logits, _ = self.head.logits(picked, request.restricted)
            cache.append(counts, width)
        self.watch.see(logits, positions[:rows], keep, counts)
        support = self.head.support if request.restricted else None
        return RowOutput(logits, hidden, support, picked)


def shape_owner(model: torch.nn.Module, hidden_layer: int) -> str:
    """What decides a model's step's shapes, as a name (`step_of_its_own`): its class, the
    config's sizes and the hidden state it hands verifiers. Two models alike in all of them
    (a target and its companion copy) may share one record of shapes."""
    config = getattr(model, "config", None)
    sizes = [
        getattr(config, key, None)
        for key in (
            "model_type",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
        )
    ]
    dtype = next(model.parameters()).dtype
    return repr((type(model).__name__, *sizes, str(dtype), hidden_layer))


def compiled_over_lean(device: torch.device) -> bool:
    """Whether a compiled runner runs a lean-capable draft compiled in the static layout
    rather than lean and eager: the lean buffers grow per step, so the lean path cannot
    compile. Chosen on a GPU, where the compiled step wins; not on a CPU, where the lean
    prepacked eager step does (docs/results/design-figures.md)."""
    return device.type == "cuda"


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


# what changes from call to call in a run, symbolic in a compiled step from its first call
# (dynamo's sources, in `body_step`'s own names): the row bucket, the attention span and the
# mask as long, and the buffers' capacity; the block's width follows the first prompt
# (`StaticBackend.prefill`). A bucket of one row stays a shape of its own (dynamo specialises
# size one), which a compiled runner on a GPU never uses (`StaticRowCache`'s `shrink`)
SYMBOLIC = ",".join(
    (
        "L['ids']:0",
        "L['positions']:0",
        "L['mask']:0",
        "L['kv'].span",
        "L['mask']:1",
        *(
            rf"L\['kv'\]\.layers\[\d+\]\.{part}:{dim}"
            for part in ("keys", "values")
            for dim in (0, 2)
        ),
    )
)


def compiled_step(step: Any, device: torch.device, cudagraphs: bool = True) -> Any:
    """`step` under `torch.compile(fullgraph=True)` with dynamo's automatic dynamic shapes:
    the dimensions every run changes (`SYMBOLIC`) are symbolic from the first call, and any
    other seen changing (the row bucket) recompiles once as a symbolic one, so the bucketed
    shapes share a few graphs (one for width 1, one past it) and compile faster than one
    graph per shape, with the same tokens; with a compile cache, a later process also
    compiles those others symbolic at once (`core.compile_cache`; pass a step of its own per
    model). Dynamo's recompile limit is raised to cover them. On CUDA the graphs replay as
    CUDA graphs (`reduce-overhead`), which records one per concrete shape. On a CPU the
    linears call the eager path's prepacked oneDNN weights through one custom op
    (`models.packed.packed_linear`) at any row count: inductor's own packing (`freezing`)
    needs a static row dimension, which the symbolic graphs lack, and without it small
    verify blocks fall back to a slow matmul path (docs/results/design-figures.md).
    `cudagraphs` false: no `reduce-overhead` on CUDA, for a caller that captures the graphs
    itself (`graphs.CapturedBackend`, the default on a GPU)."""
    limit = 256  # row buckets x widths x capacities of a run stay far below this
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, limit)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, limit)
    compiler = torch.compiler.config
    if SYMBOLIC not in compiler.dynamic_sources:
        compiler.dynamic_sources = ",".join(x for x in (compiler.dynamic_sources, SYMBOLIC) if x)
    if device.type == "cuda" and cudagraphs:
        return torch.compile(step, fullgraph=True, dynamic=None, mode="reduce-overhead")
    return torch.compile(step, fullgraph=True, dynamic=None)
