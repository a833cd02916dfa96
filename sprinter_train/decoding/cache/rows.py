"""One model's KV cache over a batch of rows that each keep their own length.

Rows of a speculative batch accept different numbers of drafts, so after a round they hold
different numbers of tokens. Two layouts were considered:

- crop every row to the shortest and re-feed what the longer rows lose: simple, but each
  call then recomputes up to a round's worth of tokens for most rows;
- keep the physical cache shared and mark, per row, which slots hold a token (and at which
  position): a rejected draft's slot is simply marked empty. New tokens are appended in one
  block of `width` slots; a row that feeds fewer leaves the rest of the block empty.

The caches here are the second: a rejection costs a mask update on the device and nothing
is recomputed. Every model the engine runs (Llama, Qwen, GPT-2/Neo, the distilled draft)
takes a 2-D attention mask and explicit position ids, and transformers builds the causal
mask from them; a row's empty slots are invisible to it, and since a row's tokens occupy
increasing slots, the physical order is its logical order. Empty slots are squeezed out by
`pack` when they outnumber the rows' tokens, so attention stays short.

`RowCache` is the interface the engine and the backends use; two caches implement it side
by side: `DynamicRowCache` (keys and values in a growing `DynamicCache`, or the lean draft's
`StaticKV`, and the slot map in host-ordered tensors) and `static_cache.StaticRowCache`
(preallocated buffers at static shapes, the slot map on the device beside them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from transformers import DynamicCache

from sprinter_train.models.lean import StaticKV


class RowCache(ABC):
    """Per row, which slots hold which positions, and the keys and values behind them.

    `position[r, s]`: the position slot s of row r holds (-1 if none); `lengths[r]`: row r
    holds positions 0 .. lengths[r] - 1; both on the model's device. `settled` (host): slots
    0 .. settled - 1 of every row hold positions 0 .. settled - 1, so `pack` need not move
    them (a lower bound; 0 when nothing is known)."""

    kv: Any
    position: torch.Tensor
    lengths: torch.Tensor
    settled: int

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def slots(self) -> int:
        return self.position.shape[1]

    @abstractmethod
    def block(self, counts: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(position ids, attention mask) of a forward appending counts[r] tokens to row r in
        a block of `width` slots."""

    @abstractmethod
    def append(self, counts: torch.Tensor, width: int) -> None:
        """Record the block `block` described, now written into `kv`."""

    @abstractmethod
    def absorb(self, groups: list[tuple[list[int], DynamicCache]], counts: list[int]) -> None:
        """Take prefill caches as this empty cache's first block: each group's cache holds its
        member rows (in order, right-padded to the group's longest) and row r's first
        counts[r] slots hold its tokens. The slots past a row's count are marked empty."""

    def crowded(self) -> bool:
        """Whether the cache needs packing before the next rounds fit (only a cache of fixed
        capacity can be full); asked once a round."""
        return False

    @abstractmethod
    def truncate(self, lengths: torch.Tensor, floor: int = 0) -> None:
        """Keep positions below lengths[r] in row r (a rejected draft's slot becomes empty).
        `floor`: a bound on the host that no lengths[r] is below (the engine's committed
        tokens), which keeps what `settled` knows."""

    @abstractmethod
    def select(self, rows: torch.Tensor) -> None:
        """Keep these rows, in this order (finished rows leave; MTAD widens a row to beams)."""

    @abstractmethod
    def pack(self, longest: int, shortest: int = 0) -> None:
        """Move every row's tokens to slots 0 .. length - 1 (`longest` = max length and
        `shortest` = min length, or any lower bound, from the host, so packing costs no
        sync); only worth it when most slots are empty. Only the slots from `settled` on
        move: the holes are where drafts were rejected since the last pack, a few dozen
        slots at the end of a cache of hundreds."""


class DynamicRowCache(RowCache):
    """Keys and values in a `DynamicCache` that grows by concatenation (or the lean draft's
    `StaticKV`, written in place, which offers the same parts of its interface); the slot
    map grows by one block a forward."""

    def __init__(self, rows: int, device: torch.device, kv: DynamicCache | StaticKV | None = None):
        self.kv = DynamicCache() if kv is None else kv
        self.position = torch.empty((rows, 0), dtype=torch.long, device=device)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        self.settled = 0

    def block(self, counts: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, width) position ids and the (rows, slots + width) mask."""
        offsets = torch.arange(width, device=self.lengths.device)
        filled = offsets[None, :] < counts[:, None]
        mask = torch.cat([self.position >= 0, filled], dim=1).long()
        return self.lengths[:, None] + offsets, mask

    def append(self, counts: torch.Tensor, width: int) -> None:
        if width == 1:  # a drafting step: two operations fewer
            block = torch.where(counts > 0, self.lengths, -1)[:, None]
        else:
            offsets = torch.arange(width, device=self.lengths.device)
            filled = offsets[None, :] < counts[:, None]
            block = torch.where(filled, self.lengths[:, None] + offsets, -1)
        self.position = torch.cat([self.position, block], dim=1)
        self.lengths = self.lengths + counts

    def absorb(self, groups: list[tuple[list[int], DynamicCache]], counts: list[int]) -> None:
        """Every row padded to the longest on the right, into a cache of this one's kind."""
        width = max(counts, default=0)
        if width == 0:
            return
        kv = type(self.kv)()
        for layer in range(len(groups[0][1].layers)):
            ref = groups[0][1].layers[layer].keys
            shape = (self.rows, ref.shape[1], width, ref.shape[3])
            keys, values = ref.new_zeros(shape), ref.new_zeros(shape)
            write_groups(keys, values, groups, layer)
            kv.update(keys, values, layer)
        counts_t = torch.as_tensor(counts, device=self.lengths.device)
        self.kv = kv
        self.append(counts_t, width)
        self.settled = min(counts)

    def truncate(self, lengths: torch.Tensor, floor: int = 0) -> None:
        lengths = torch.minimum(self.lengths, lengths)
        self.position = self.position.masked_fill(self.position >= lengths[:, None], -1)
        self.lengths = lengths
        self.settled = min(self.settled, floor)

    def select(self, rows: torch.Tensor) -> None:
        if self.kv.get_seq_length() > 0:
            self.kv.batch_select_indices(rows)
        self.position = self.position[rows]
        self.lengths = self.lengths[rows]

    def pack(self, longest: int, shortest: int = 0) -> None:
        """The moved slots are written over the old ones in place (one gather per layer),
        so every slot ends where a full gather would put it; the layers are then cut to
        `longest` slots."""
        if self.slots == longest or self.kv.get_seq_length() == 0:
            return
        start = min(self.settled, longest)
        index = pack_index(self.position, start, longest)
        spreads: dict[tuple[int, int], torch.Tensor] = {}  # by (heads, head dim)
        with torch.inference_mode():  # the buffers are inference tensors
            for layer in self.kv.layers:
                keys, values = layer.keys, layer.values
                shape = (keys.shape[1], keys.shape[3])
                if shape not in spreads:
                    spreads[shape] = index.expand(-1, shape[0], -1, shape[1])
                spread = spreads[shape]
                keys[:, :, start:longest] = keys.gather(2, spread)
                values[:, :, start:longest] = values.gather(2, spread)
                layer.keys = keys[:, :, :longest]
                layer.values = values[:, :, :longest]
        columns = torch.arange(longest, device=self.lengths.device)
        self.position = torch.where(columns[None, :] < self.lengths[:, None], columns, -1)
        self.settled = shortest


def pack_index(position: torch.Tensor, start: int, longest: int) -> torch.Tensor:
    """(rows, 1, longest - start, 1): the slot each of slots start .. longest - 1 takes its
    keys and values from when the held slots of `position` (rows, slots) move down."""
    tail = position[:, start:]
    width = longest - start
    target = torch.where(tail >= 0, tail - start, width)  # empty slots go to a spare column
    source = torch.arange(start, position.shape[1], device=target.device).expand_as(target)
    index = torch.zeros((position.shape[0], width + 1), dtype=torch.long, device=target.device)
    index.scatter_(1, target, source)
    return index[:, None, :width, None]


def write_groups(
    keys: torch.Tensor,
    values: torch.Tensor,
    groups: list[tuple[list[int], DynamicCache]],
    layer: int,
) -> None:
    """Copy each group's keys and values of `layer` into rows `members` of (rows, heads,
    slots, head dim) buffers, from slot 0: one copy per group, not per row."""
    for members, group in groups:
        index = torch.as_tensor(members, device=keys.device)
        k, v = group.layers[layer].keys, group.layers[layer].values
        keys[index, :, : k.shape[2]] = k
        values[index, :, : v.shape[2]] = v
