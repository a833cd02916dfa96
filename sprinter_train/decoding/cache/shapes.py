"""The static layout's shapes: the row bucket a batch runs at, the capacity a cache gets and
the span of slots a forward attends over. Few distinct values on purpose: every distinct
(row bucket, width, capacity, span) is one more graph to compile or capture, so sizes are
rounded to buckets that repeat (`static_cache` holds the buffers these size).

A forward attends over the filled slots only, not the whole capacity: every slot a row holds,
and the block it writes, lies below the write counter plus the block's width, so the keys,
values and mask a forward hands the attention are cut to an attention span
(`attention_span`, `SlotMappedKV.span`) at least that long, a bucket of it so that shapes
repeat. A step's attention then costs what the tokens held cost, whatever the capacity. The
span is a shape, so it multiplies the shapes a compiled or captured forward sees:

- run eagerly, the spans follow the capacity buckets (64, 128, then multiples of 128), so a
  forward attends over fewer than 128 slots past the filled ones;
- compiled, the span is one more dimension dynamo makes symbolic once it has seen it
  change (one recompile), so the spans share a graph; a new span's first forward is counted
  as compile time, as a new shape's is;
- captured, each span is one more recorded graph (a CUDA graph has one shape), so the spans
  there are powers of two from `MIN_CAPACITY` (`coarse`): at most log2(capacity / 64) + 1 of
  them per (row bucket, width), each under twice the filled slots (or 64). The trade-off:
  more graphs to record and hold, for a replay whose attention stops growing with the
  capacity (docs/results/static-capacity.md).
"""

from __future__ import annotations

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
    a capacity far past the tokens held costs memory, and every forward whose attention span
    reaches it (docs/results/design-figures.md, "Static capacities")."""
    if slots <= CAPACITY_STEP:
        return power_bucket(slots)
    return -(-slots // CAPACITY_STEP) * CAPACITY_STEP


def power_bucket(slots: int) -> int:
    """The next power of two >= `slots`, at least MIN_CAPACITY."""
    return max(MIN_CAPACITY, 1 << max(slots - 1, 0).bit_length())


def attention_span(filled: int, capacity: int, coarse: bool = False) -> int:
    """The slots a forward attends over when no row holds or writes a slot at or past
    `filled`: the capacity bucket of `filled` (`coarse`: the next power of two >=
    MIN_CAPACITY, fewer distinct spans), never past `capacity`."""
    return min(power_bucket(filled) if coarse else capacity_bucket(filled), capacity)
