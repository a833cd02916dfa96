"""One backend per cache layout, each running a `ForwardRequest` over its own kind of cache.

- `DynamicBackend`: the model's own forward over a `DynamicRowCache` (the reference layout:
  full-vocabulary logits even for a restricted head).
- `LeanBackend`: the distilled draft through `models.lean.LeanDraft` over the lean buffers
  (the same arithmetic without Hugging Face's per-step mask and cache machinery).
- `StaticBackend`: the model's body at a few static shapes over a `StaticRowCache`, run
  eagerly or compiled (`compiled.compiled_step`: two graphs, one-token blocks and wider
  ones), attending over the filled slots' span only (`static_cache.attention_span`).

`ModelRunner` builds the one its resolved layout (`runner.layout.RunnerLayout`, made by
`decoding.builder`) names; the backends only read that layout, never decide it. Capture
wraps the static one (`capture.CapturedBackend`) rather than branching inside it, and every
backend ends its forward with the one tail (`head.tail`, then the broken-logits watch).
"""

from __future__ import annotations

from typing import Any

import torch

from sprinter_train.core.compile_cache import loaded_graphs
from sprinter_train.decoding.cache.rows import DynamicRowCache
from sprinter_train.decoding.cache.static import KVPool, StaticRowCache
from sprinter_train.decoding.runner.clock import ForwardClock
from sprinter_train.decoding.runner.compile import compiled_graphs, compiled_step
from sprinter_train.decoding.runner.head import BrokenWatch, Head, tail
from sprinter_train.decoding.runner.layout import RunnerLayout
from sprinter_train.decoding.runner.requests import ForwardRequest, RowOutput
from sprinter_train.models.body import StaticBody, body
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
            # the reference layout: the full vocabulary, whatever the head
            logits, hidden, picked, _ = tail(
                self.head, final, chosen, keep, False, self.hidden_layer
            )
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
            logits, hidden, picked, support = tail(
                self.head, final, chosen, keep, request.restricted, self.hidden_layer, True
            )
        self.watch.see(logits, positions, keep, counts)
        return RowOutput(logits, hidden, support, picked)


class StaticBackend(Backend):
    """The body at static shapes over a `StaticRowCache`: the block and the mask padded to
    the cache's row bucket and capacity, the inert rows' outputs dropped, the attention cut
    to the span of the filled slots (`StaticRowCache.attend`; the layout's `coarse_spans`:
    powers of two, fewer shapes). A `compiled` layout's `step` is `body` (a `StaticBody`)
    under `compiled_step` (with `reduce-overhead` where the layout says, and its graphs kept
    in the layout's compile cache). Caches start with at least the layout's `min_capacity`
    slots (fewer shapes), take their buffers from `pool`, and keep their row bucket as rows
    leave unless `shrink_rows`."""

    def __init__(self, *args: Any, layout: RunnerLayout, pool: KVPool) -> None:
        super().__init__(*args)
        self.layout = layout
        self.compiled = layout.compiled
        self.name = "static"
        if layout.compiled:
            self.name = "compiled:" + ("cudagraphs" if layout.reduce_overhead else "packed")
        self.body = StaticBody(self.model, self.hidden_layer)
        self.step: Any = self.body
        self.prefills = layout.prefills
        if layout.compiled:
            self.step = compiled_step(
                self.body, self.device, layout.reduce_overhead, layout.saved_steps
            )
        self.min_capacity = layout.min_capacity
        self.pool = pool
        self.shrink_rows = layout.shrink_rows
        self.coarse_spans = layout.coarse_spans
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
        """Loading saved graphs is the compile of a process that finds them: counted too."""
        return (compiled_graphs() + loaded_graphs() if self.compiled else 0), 0

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

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        kv: Any,
        keep: torch.Tensor,
        restricted: bool,
        rows: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The step over a padded block, then the tail (`head.tail`): (logits, hidden,
        picked, support) of the first `rows` rows (None: every row of the bucket). What
        `run` runs eagerly and a captured graph records (`CapturedBackend.record_forward`)."""
        final, chosen = self.step(ids, positions, mask, kv)
        if rows is not None:
            final, chosen = final[:rows], chosen[:rows]
        return tail(self.head, final, chosen, keep, restricted, self.hidden_layer)

    def run(self, cache: StaticRowCache, request: ForwardRequest) -> RowOutput:
        ids, compiling = self.prepare(cache, request)
        rows, width, counts, keep = request.rows, request.width, request.counts, request.keep
        with self.clock.timed((rows, width), compiling):
            positions, mask = cache.block(counts, width)
            logits, hidden, picked, support = self.forward(
                ids, positions, mask, cache.kv, keep, request.restricted, rows
            )
            cache.append(counts, width)
        self.watch.see(logits, positions[:rows], keep, counts)
        return RowOutput(logits, hidden, support, picked)
