"""A `RowCache` over preallocated KV buffers, so every forward has a static shape.

`RowCache` already writes each forward's block of `width` slots at the same columns
[slots, slots + width) for every row, with per-row position ids and a 2-D mask of the slots
a row holds. That is exactly transformers' `StaticCache` contract: each layer's keys and
values live in a (rows, heads, capacity, head dim) buffer written in place at a slot counter
(`StaticLayer.cumulative_length`, a device tensor), and the attention mask covers the whole
capacity. So this layout keeps `RowCache`'s bookkeeping (`position`, `lengths`, `settled`)
unchanged and changes only where the keys and values live:

- the buffers are a `transformers.StaticCache` allocated once per generation at a capacity
  bucket (covering prompt + budget + slack: a power of two >= `MIN_CAPACITY` up to 128, then a
  multiple of 128, see `capacity_bucket`) and a row bucket
  (the rows rounded up to a power of two); the mask is padded with zeros to the capacity and
  the batch with inert rows (nothing held, only their own block slots visible, outputs
  dropped), so a forward's shapes depend on (row bucket, width, capacity) alone and a
  compiled forward (`torch.compile(fullgraph=True)`, see `runner.compiled_step`) is reused
  across rounds;
- a `DynamicCache` grows by concatenation each forward and `pack` truncates it; here `pack`
  moves the held slots down in place and resets the slot counter, and `select` gathers rows
  in place while the row bucket holds (a new bucket allocates new buffers: a new shape);
- when a block would run past the capacity, the cache grows to the next bucket (a copy and a
  new shape), and `crowded` tells the engine to pack before that happens;
- buffers outlive their cache in a `KVPool`: the next generation of the same shape gets the
  same addresses back (zeroed), so a CUDA graph recorded on them replays instead of being
  recorded again each generation; and on a GPU a compiled cache never shrinks its row
  bucket when rows leave (`shrink=False`): the leavers' rows turn inert (next to free on a
  GPU), so a batch that empties row by row stays at one shape and one CUDA graph.

Masked slots get exactly zero attention weight, so a row's arithmetic is that of the dynamic
layout over more (ignored) columns: the tokens do not change.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

import torch
from transformers import StaticCache

from sprinter_train.decoding.cache import RowCache, write_groups

MIN_CAPACITY = 64  # smallest capacity bucket: short generations share one shape
CAPACITY_STEP = 128  # capacity buckets past it are its multiples (see capacity_bucket)
MAX_ROW_BUCKET = 64  # rows are rounded to powers of two up to here, to multiples of it past it


def row_bucket(rows: int) -> int:
    """The batch size a forward of `rows` rows runs at: the next power of two (<= 64), then
    the next multiple of 64."""
    if rows <= MAX_ROW_BUCKET:
        return 1 << max(rows - 1, 0).bit_length()
    return -(-rows // MAX_ROW_BUCKET) * MAX_ROW_BUCKET


def capacity_bucket(slots: int) -> int:
    """The capacity a cache of at least `slots` slots gets: a power of two >= MIN_CAPACITY up
    to CAPACITY_STEP, then the next multiple of CAPACITY_STEP. Not powers of two all the way:
    a static forward attends over its whole capacity, and on the 2-core CPU (float32, 135M
    target, 4 rows, 600 held tokens) a 4-token forward took 198 ms dynamic, 233 ms at a
    capacity of 1,024 and 861 ms at 2,048, the bucket a prompt just past 1,000 tokens got."""
    if slots <= CAPACITY_STEP:
        return max(MIN_CAPACITY, 1 << max(slots - 1, 0).bit_length())
    return -(-slots // CAPACITY_STEP) * CAPACITY_STEP


def supports_static(model: torch.nn.Module) -> bool:
    """Whether `model` is a transformers model that takes a `StaticCache` (and compiles with
    it in one graph)."""
    return bool(getattr(model, "_can_compile_fullgraph", False)) and hasattr(model, "config")


class KVPool:
    """Free `StaticCache`s by (row bucket, capacity), for the next cache of that shape: the
    same buffer addresses every generation (a CUDA graph recorded on them stays valid). Holds
    the `keep` most recently freed shapes, one cache each, so memory stays bounded."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._free: OrderedDict[tuple[int, int], StaticCache] = OrderedDict()

    def take(self, key: tuple[int, int]) -> StaticCache | None:
        return self._free.pop(key, None)

    def give(self, key: tuple[int, int], kv: StaticCache) -> None:
        self._free[key] = kv
        self._free.move_to_end(key)
        while len(self._free) > self.keep:
            self._free.popitem(last=False)

    def __len__(self) -> int:
        return len(self._free)


def _give_back(pool: KVPool, held: dict) -> None:
    """A cache's finaliser: its buffers go back to the pool (never references the cache)."""
    pool.give(held["key"], held["kv"])


class StaticRowCache(RowCache):
    """`RowCache` whose keys and values live in a preallocated `StaticCache` of `capacity`
    slots and `row_bucket(rows)` rows (see the module docstring). With a `pool`, buffers are
    taken from it and given back when replaced or when the cache is collected; `shrink=False`
    keeps the row bucket when rows leave."""

    def __init__(
        self,
        rows: int,
        device: torch.device,
        model: torch.nn.Module,
        capacity: int,
        pool: KVPool | None = None,
        shrink: bool = True,
    ) -> None:
        super().__init__(rows, device)
        self.model = model
        self.capacity = capacity_bucket(capacity)
        self.bucket = row_bucket(rows)
        self.shrink = shrink
        self._pool = pool
        self._held: dict = {}  # the buffers in use and their pool key (the finaliser's view)
        self.kv = self._allocate(self.bucket, self.capacity)
        if pool is not None:
            weakref.finalize(self, _give_back, pool, self._held)
        self._round_start = 0  # `slots` when the engine last asked `crowded`
        self._round_growth = 0  # slots the last round appended

    def _allocate(self, rows: int, capacity: int) -> StaticCache:
        """Buffers for (rows, capacity): the pool's, zeroed, when it has them."""
        kv = None if self._pool is None else self._pool.take((rows, capacity))
        if kv is None:
            kv = self._new_buffers(rows, capacity)
        else:
            with torch.inference_mode():
                for layer in kv.layers:
                    layer.keys.zero_()
                    layer.values.zero_()
                    layer.cumulative_length.fill_(0)
        self._held.update(key=(rows, capacity), kv=kv)
        return kv

    def _new_buffers(self, rows: int, capacity: int) -> StaticCache:
        config = self.model.config.get_text_config(decoder=True)
        # GPT-2's config has no num_key_value_heads (every head its own keys and values)
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        dtype = next(self.model.parameters()).dtype
        with torch.inference_mode():  # inference tensors, whenever allocated (see `_set_slots`)
            kv = StaticCache(config, max_cache_len=capacity)
            kv.early_initialization(rows, heads, head_dim, dtype, self.lengths.device)
        return kv

    @property
    def buffers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.keys, layer.values) for layer in self.kv.layers]

    def _set_slots(self, slots: int) -> None:
        """Point every layer's write counter at slot `slots` (in place: a static address)."""
        with torch.inference_mode():  # the buffers and counters are inference tensors
            for layer in self.kv.layers:
                layer.cumulative_length.fill_(slots)

    def reserve(self, width: int) -> None:
        """Make room for a block of `width` slots: grow to the next capacity bucket when the
        block would run past the buffers (a copy, and a new shape for a compiled forward)."""
        if self.slots + width <= self.capacity:
            return
        capacity = capacity_bucket(self.slots + width)
        self._replace(torch.arange(self.rows, device=self.lengths.device), capacity)
        self.capacity = capacity

    def crowded(self) -> bool:
        """Whether two more rounds like the last might not fit: the engine then packs. Marks
        the start of the next round."""
        self._round_growth = self.slots - self._round_start
        crowded = self.slots + 2 * self._round_growth > self.capacity
        self._round_start = self.slots
        return crowded

    def block(self, counts: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`RowCache.block` with the mask padded to (row bucket, capacity): the slots past
        the block are empty, and an inert row sees only its own block slots."""
        positions, mask = super().block(counts, width)
        mask = torch.nn.functional.pad(mask, (0, self.capacity - mask.shape[1]))
        return self.pad_rows(positions), self._pad_mask(mask, width)

    def _pad_mask(self, mask: torch.Tensor, width: int) -> torch.Tensor:
        extra = self.bucket - self.rows
        if extra == 0:
            return mask
        inert = mask.new_zeros((extra, self.capacity))
        inert[:, self.slots : self.slots + width] = 1
        return torch.cat([mask, inert])

    def pad_rows(self, values: torch.Tensor) -> torch.Tensor:
        """(rows, ...) → (row bucket, ...): inert rows of zeros appended."""
        extra = self.bucket - self.rows
        if extra == 0:
            return values
        return torch.cat([values, values.new_zeros((extra, *values.shape[1:]))])

    def append(self, kv, counts: torch.Tensor, width: int) -> None:
        super().append(self.kv, counts, width)

    def absorb(self, groups, counts: list[int]) -> None:
        """`RowCache.absorb` into slots 0 .. max(counts) - 1 of the buffers."""
        width = max(counts, default=0)
        if width == 0:
            return
        self.reserve(width)
        with torch.inference_mode():
            for layer, (keys, values) in enumerate(self.buffers):
                write_groups(keys, values, groups, layer)
        self._set_slots(width)
        counts_t = torch.as_tensor(counts, device=self.lengths.device)
        RowCache.append(self, self.kv, counts_t, width)
        self.settled = min(counts)

    def select(self, rows: torch.Tensor) -> None:
        """Keep these rows, in this order: gathered in place while the row bucket holds (or
        when the cache does not shrink), into new buffers of the new bucket otherwise."""
        bucket = row_bucket(len(rows))
        if not self.shrink:
            bucket = max(bucket, self.bucket)
        if bucket == self.bucket:
            with torch.inference_mode():
                for keys, values in self.buffers:
                    keys[: len(rows)] = keys[rows]
                    values[: len(rows)] = values[rows]
        else:
            self.bucket = bucket
            self._replace(rows, self.capacity)
        self.position = self.position[rows]
        self.lengths = self.lengths[rows]

    def _replace(self, rows: torch.Tensor, capacity: int) -> None:
        """New buffers (this bucket, `capacity`) holding `rows` of the old ones."""
        old, old_key, old_kv = self.buffers, self._held["key"], self._held["kv"]
        self.kv = self._allocate(self.bucket, capacity)
        span = min(self.slots, capacity)
        with torch.inference_mode():
            for (keys, values), (new_keys, new_values) in zip(old, self.buffers, strict=True):
                new_keys[: len(rows), :, :span] = keys[rows, :, :span]
                new_values[: len(rows), :, :span] = values[rows, :, :span]
        if self._pool is not None:  # copied out: the old buffers serve the next cache
            self._pool.give(old_key, old_kv)
        self._set_slots(self.slots)

    def pack(self, longest: int, shortest: int = 0) -> None:
        """`RowCache.pack` in place: the held slots move down, the buffers keep their shape
        and the write counter goes back to `longest`."""
        if self.slots == longest:
            return
        start = min(self.settled, longest)
        index = self._pack_index(start, longest)
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
        self._after_pack(longest, shortest)
        self._round_start = self.slots
