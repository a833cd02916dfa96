"""A `RowCache` over preallocated KV buffers, so every forward has a static shape.

`DynamicRowCache` already writes each forward's block of `width` slots at the same columns
[slots, slots + width) for every row, with per-row position ids and a 2-D mask of the slots
a row holds. That is exactly transformers' `StaticCache` contract: each layer's keys and
values live in a (rows, heads, capacity, head dim) buffer written in place at a slot counter
(`StaticLayer.cumulative_length`, a device tensor), and the attention mask covers the whole
capacity. So `StaticRowCache` keeps the same bookkeeping (`position`, `lengths`, `settled`)
and changes where it and the keys and values live:

- the buffers are a `SlotMappedKV` (a transformers cache of `StaticLayer`s that also holds
  the slot map, `position` and `lengths`, in buffers of the whole capacity and row bucket)
  allocated once per generation at a capacity bucket (`capacity_bucket`: prompt + budget +
  slack) and a row bucket (`row_bucket`); the mask is padded with zeros to the attention
  span (below) and the batch with inert rows (nothing held, only their own block slots
  visible, outputs dropped), so a forward's shapes depend on (row bucket, width, capacity,
  attention span) alone and a compiled forward (`compiled.compiled_step`) is reused across
  rounds;
- the block is written into the slot map on the device before the forward and the mask read
  from it (`SlotMappedKV.block`), at fixed addresses, so a captured graph records that work
  with the body and replays it, instead of building the mask on the host's orders;
- `pack` moves the held slots down in place and resets the slot counter, and `select`
  gathers rows in place while the row bucket holds (a new bucket allocates new buffers: a
  new shape);
- when a block would run past the capacity, the cache grows to the next bucket (a copy and a
  new shape), and `crowded` tells the engine to pack before that happens;
- buffers outlive their cache in a `KVPool`: the next generation of the same shape gets the
  same addresses back (zeroed), so a CUDA graph recorded on them replays instead of being
  recorded again each generation; and a cache made with `shrink=False` never shrinks its
  row bucket when rows leave: the leavers' rows turn inert, so a batch that empties row by
  row stays at one shape and one CUDA graph.

Masked slots get exactly zero attention weight, so a row's arithmetic is that of the dynamic
layout over more (ignored) columns: the tokens do not change.

A forward attends over the filled slots only, not the whole capacity: the span and its
trade-off are `static_shapes`'s.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

import torch
from transformers.cache_utils import Cache, StaticLayer

from sprinter_train.decoding.cache.rows import RowCache, pack_index, write_groups
from sprinter_train.decoding.cache.shapes import (  # the buckets, re-exported for callers
    attention_span,
    capacity_bucket,
    row_bucket,
)
from sprinter_train.models.families import kv_layout


def supports_static(model: torch.nn.Module) -> bool:
    """Whether `model` is a transformers model that takes a `StaticCache` (and compiles with
    it in one graph)."""
    return bool(getattr(model, "_can_compile_fullgraph", False)) and hasattr(model, "config")


class KVPool:
    """Free `SlotMappedKV`s by (row bucket, capacity), for the next cache of that shape: the
    same buffer addresses every generation (a CUDA graph recorded on them stays valid). Holds
    the `keep` most recently freed shapes, one cache each, so memory stays bounded."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._free: OrderedDict[tuple[int, int], SlotMappedKV] = OrderedDict()

    def take(self, key: tuple[int, int]) -> SlotMappedKV | None:
        return self._free.pop(key, None)

    def give(self, key: tuple[int, int], kv: SlotMappedKV) -> None:
        self._free[key] = kv
        self._free.move_to_end(key)
        while len(self._free) > self.keep:
            self._free.popitem(last=False)

    def __len__(self) -> int:
        return len(self._free)


def _give_back(pool: KVPool, held: dict) -> None:
    """A cache's finaliser: its buffers go back to the pool (never references the cache)."""
    pool.give(held["key"], held["kv"])


class SlotMappedKV(Cache):
    """A transformers `Cache` of `StaticLayer`s (`StaticCache`'s layers) that also holds its
    rows' slot map, on the device at static addresses: `position[r, s]` (the position slot s
    of row r holds, -1 if none: (row bucket, capacity)) and `lengths[r]` (row bucket,). With
    them a forward's bookkeeping, the block's position ids, its slots marked and the
    attention mask, is device work over fixed buffers (`block`), so a captured graph records
    it with the body instead of leaving it to host ops around the graph. The buffers travel
    with the keys and values through the `KVPool`, so a pooled cache's graph replays on the
    same addresses.

    `span`: how many of the capacity's slots a forward attends over (`attention_span`): the
    layers still write into the whole buffers, but hand the attention their first `span`
    slots, and the mask (`block`, `get_mask_sizes`) is that long. The caller sets it before
    each forward; it starts at the capacity."""

    def __init__(self, rows: int, capacity: int, shape: tuple, device: Any) -> None:
        """`shape`: (heads, head dim, dtype) of the keys and values, the first two per layer."""
        heads, head_dim, dtype = shape
        # full-attention layers throughout: transformers' sliding-window layer keeps a python
        # count of its own that pack and truncate cannot rewind (the mask bounds the window)
        # one slot past the capacity, never written nor attended: a span slice then never
        # covers a whole buffer, so a compiled step never specialises on `span == capacity`
        # (a contiguous slice) and one graph serves every span
        super().__init__(layers=[StaticLayer(max_cache_len=capacity + 1) for _ in heads])
        self.early_initialization(rows, heads, head_dim, dtype, device)
        self.position = torch.full((rows, capacity), -1, dtype=torch.long, device=device)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        self.columns = torch.arange(capacity, device=device)
        self.span = capacity

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's block written into its whole buffers; its first `span` slots returned."""
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        return keys[:, :, : self.span], values[:, :, : self.span]

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        """(kv length, kv offset) of the attention: the span, from slot 0."""
        return self.span, 0

    @property
    def written(self) -> list[torch.Tensor]:
        """Every buffer a forward writes (what a stand-in capture puts back)."""
        per_layer = [(x.keys, x.values, x.cumulative_length) for x in self.layers]
        return [t for layer in per_layer for t in layer] + [self.position, self.lengths]

    def clear(self) -> None:
        """As allocated: nothing held (the pool's next cache of this shape). Every layer's
        buffers in one multi-tensor op: a launch, not three a layer."""
        per_layer = [(x.keys, x.values, x.cumulative_length) for x in self.layers]
        torch._foreach_zero_([t for layer in per_layer for t in layer] + [self.lengths])
        self.position.fill_(-1)
        self.span = len(self.columns)

    def block(
        self, counts: torch.Tensor, width: int, inert: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(position ids, attention mask over the row bucket and the first `span` slots) of a
        forward appending counts[r] tokens to row r in a block of `width` slots at the write
        counter, with the block recorded first: its filled slots marked in `position` and
        `lengths` advanced. A row with nothing held and nothing fed (an inert row) sees its
        own block slots, so its attention has something to weigh; its outputs are never
        read. `inert` false: the caller knows there is no such row (six ops fewer)."""
        start = self.layers[0].cumulative_length  # the block's first slot, on the device
        offsets = torch.arange(width, device=counts.device)
        positions = self.lengths[:, None] + offsets
        filled = offsets < counts[:, None]
        self.position.index_copy_(1, start + offsets, torch.where(filled, positions, -1))
        self.lengths.add_(counts)
        mask = self.position[:, : self.span] >= 0
        if inert:
            columns = self.columns[: self.span]
            in_block = (columns >= start) & (columns < start + width)
            mask |= (self.lengths == 0)[:, None] & in_block
        return positions, mask.long()


class StaticRowCache(RowCache):
    """A `RowCache` whose keys, values and slot map live in a preallocated `SlotMappedKV` of
    `capacity` slots and `row_bucket(rows)` rows (see the module docstring). `position` and
    `lengths` are views of the live rows and slots of its buffers (live: a forward writes
    them in place); `rows` and `slots` are kept on the host. With a `pool`, buffers are taken
    from it and given back when replaced or when the cache is collected; `shrink=False`
    keeps the row bucket when rows leave, and starts at two rows at least."""

    def __init__(
        self,
        rows: int,
        device: torch.device,
        model: torch.nn.Module,
        capacity: int,
        pool: KVPool | None = None,
        shrink: bool = True,
    ) -> None:
        self.model = model
        self.device = torch.device(device)
        self.capacity = capacity_bucket(capacity)
        # one that keeps its bucket (compiled on a GPU, where an inert row costs next to
        # nothing) holds two rows at least: dynamo specialises a dimension of size one, so a
        # one-row bucket would compile graphs no other bucket shares
        self.bucket = row_bucket(rows) if shrink else max(row_bucket(rows), 2)
        self.shrink = shrink
        self.settled = 0
        self._rows = rows
        self._slots = 0
        self._pool = pool
        self._held: dict = {}  # the buffers in use and their pool key (the finaliser's view)
        self.kv = self._allocate(self.bucket, self.capacity)
        if pool is not None:
            weakref.finalize(self, _give_back, pool, self._held)
        self._round_start = 0  # `slots` when the engine last asked `crowded`
        self._round_growth = 0  # slots the last round appended

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def position(self) -> torch.Tensor:
        return self.kv.position[: self._rows, : self._slots]

    @property
    def lengths(self) -> torch.Tensor:
        return self.kv.lengths if self._rows == self.bucket else self.kv.lengths[: self._rows]

    def _allocate(self, rows: int, capacity: int) -> SlotMappedKV:
        """Buffers for (rows, capacity): the pool's, cleared, when it has them."""
        kv = None if self._pool is None else self._pool.take((rows, capacity))
        if kv is None:
            kv = self._new_buffers(rows, capacity)
        else:
            with torch.inference_mode():
                kv.clear()
        self._held.update(key=(rows, capacity), kv=kv)
        return kv

    def _new_buffers(self, rows: int, capacity: int) -> SlotMappedKV:
        layout = kv_layout(self.model)  # as the model writes them, not re-derived from config
        dtype = next(self.model.parameters()).dtype
        shape = (layout.heads, layout.head_dims, dtype)
        with torch.inference_mode():  # inference tensors, whenever allocated (see `_set_slots`)
            return SlotMappedKV(rows, capacity, shape, self.device)

    @property
    def buffers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.keys, layer.values) for layer in self.kv.layers]

    def _set_slots(self, slots: int) -> None:
        """Point every layer's write counter at slot `slots` (in place: a static address)."""
        self._slots = slots
        with torch.inference_mode():  # the buffers and counters are inference tensors
            for layer in self.kv.layers:
                layer.cumulative_length.fill_(slots)

    def reserve(self, width: int) -> None:
        """Make room for a block of `width` slots: grow to the next capacity bucket when the
        block would run past the buffers (a copy, and a new shape for a compiled forward)."""
        if self.slots + width <= self.capacity:
            return
        capacity = capacity_bucket(self.slots + width)
        self._replace(torch.arange(self.rows, device=self.device), capacity)
        self.capacity = capacity

    def crowded(self) -> bool:
        """Whether two more rounds like the last might not fit: the engine then packs. Marks
        the start of the next round."""
        self._round_growth = self.slots - self._round_start
        crowded = self.slots + 2 * self._round_growth > self.capacity
        self._round_start = self.slots
        return crowded

    def attend(self, width: int, coarse: bool = False) -> int:
        """Set and return the span the next forward, a block of `width` slots, attends over
        (`attention_span` of the write counter plus `width`; call `reserve` first)."""
        self.kv.span = attention_span(self.slots + width, self.capacity, coarse)
        return self.kv.span

    def block(self, counts: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`SlotMappedKV.block` over the row bucket (inert rows feed nothing): unlike
        `DynamicRowCache.block`, it records the block on the device too; `append` then moves
        the host's slot count. A captured forward runs it in its graph instead."""
        with torch.inference_mode():
            return self.kv.block(self.pad_rows(counts), width, self.bucket > self.rows)

    def pad_rows(self, values: torch.Tensor) -> torch.Tensor:
        """(rows, ...) → (row bucket, ...): inert rows of zeros appended."""
        extra = self.bucket - self.rows
        if extra == 0:
            return values
        return torch.cat([values, values.new_zeros((extra, *values.shape[1:]))])

    def append(self, counts: torch.Tensor, width: int) -> None:
        """The block `block` recorded on the device now fills `width` more slots."""
        self._slots += width

    def absorb(self, groups: list[tuple[list[int], Any]], counts: list[int]) -> None:
        """Into slots 0 .. max(counts) - 1 of the buffers."""
        width = max(counts, default=0)
        if width == 0:
            return
        self.reserve(width)
        counts_t = torch.as_tensor(counts, device=self.device)
        with torch.inference_mode():
            for layer, (keys, values) in enumerate(self.buffers):
                write_groups(keys, values, groups, layer)
            self.kv.lengths[: self.rows] = counts_t
        self._set_slots(width)
        self._mark_from_lengths()
        self.settled = min(counts)

    def truncate(self, lengths: torch.Tensor, floor: int = 0) -> None:
        """In place; over the whole slot map when the rows fill the bucket (fewer host ops)."""
        with torch.inference_mode():
            held = self.lengths
            torch.minimum(held, lengths, out=held)
            position = self.kv.position if self._rows == self.bucket else self.position
            position.masked_fill_(position >= held.unsqueeze(1), -1)
        self.settled = min(self.settled, floor)

    def select(self, rows: torch.Tensor) -> None:
        """Keep these rows, in this order: gathered in place while the row bucket holds (or
        when the cache does not shrink; the rows past them turn inert), into new buffers of
        the new bucket otherwise."""
        bucket = row_bucket(len(rows))
        if not self.shrink:
            bucket = max(bucket, self.bucket)
        n = len(rows)
        if bucket == self.bucket:
            kv = self.kv
            with torch.inference_mode():
                for keys, values in self.buffers:
                    keys[:n] = keys[rows]
                    values[:n] = values[rows]
                kv.position[:n] = kv.position[rows]
                kv.lengths[:n] = kv.lengths[rows]
                kv.position[n:] = -1
                kv.lengths[n:] = 0
        else:
            self.bucket = bucket
            self._replace(rows, self.capacity)
        self._rows = n

    def _replace(self, rows: torch.Tensor, capacity: int) -> None:
        """New buffers (this bucket, `capacity`) holding `rows` of the old ones."""
        old, old_key = self.kv, self._held["key"]
        self.kv = self._allocate(self.bucket, capacity)
        span, n = min(self.slots, capacity), len(rows)
        with torch.inference_mode():
            for old_layer, new_layer in zip(old.layers, self.kv.layers, strict=True):
                new_layer.keys[:n, :, :span] = old_layer.keys[rows, :, :span]
                new_layer.values[:n, :, :span] = old_layer.values[rows, :, :span]
            self.kv.position[:n, :span] = old.position[rows, :span]
            self.kv.lengths[:n] = old.lengths[rows]
        if self._pool is not None:  # copied out: the old buffers serve the next cache
            self._pool.give(old_key, old)
        self._set_slots(self.slots)

    def pack(self, longest: int, shortest: int = 0) -> None:
        """In place: the held slots move down, the buffers keep their shape and the write
        counter goes back to `longest`."""
        if self.slots == longest:
            return
        start = min(self.settled, longest)
        index = pack_index(self.position, start, longest)
        n = self.rows
        spreads: dict[tuple[int, int], torch.Tensor] = {}
        with torch.inference_mode():
            for keys, values in self.buffers:
                shape = (keys.shape[1], keys.shape[3])
                if shape not in spreads:
                    spreads[shape] = index.expand(-1, shape[0], -1, shape[1])
                keys[:n, :, start:longest] = keys[:n].gather(2, spreads[shape])
                values[:n, :, start:longest] = values[:n].gather(2, spreads[shape])
        self._set_slots(longest)
        self._mark_from_lengths()
        self.settled = shortest
        self._round_start = self.slots

    def _mark_from_lengths(self) -> None:
        """Every row's tokens sit in slots 0 .. length - 1: mark them so (the rest empty)."""
        columns = self.kv.columns
        with torch.inference_mode():
            marks = torch.where(columns[None, :] < self.lengths[:, None], columns, -1)
            self.kv.position[: self.rows] = marks
