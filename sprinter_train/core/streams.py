"""Per-row random streams that live on the model's device and never sync the host.

A batched decoder must give every row the tokens it would get decoded alone: its draws may
depend only on its own seed and on how many numbers it has drawn so far, never on its
batch-mates. `RowStreams` is SplitMix64 (Steele et al. 2014) evaluated as a counter-based
generator: draw k of row r is mix(key_r + (counter_r + k) * golden), vectorised over rows in
int64 tensor arithmetic (which wraps modulo 2^64), so one call serves the whole batch and a
row that draws nothing this step keeps its counter.

A draw is a function of (key, index) alone, so the streams hash each row's next `BLOCK`
numbers at once and hand draws out of that block by index: a speculative round takes a few
numbers one at a time, and the twenty-odd int64 operations of the hash then run once every
several rounds instead of for every draw (per draw they cost a CPU a large share of a
draft step's sampling: docs/results/design-figures.md, "Random streams"). The numbers are the same whatever the block size.
"""

from __future__ import annotations

from typing import TypeVar

import torch

Word = TypeVar("Word", torch.Tensor, int)  # int64 tensors, or one int64 as a Python int

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
_MUL1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MUL2 = -7723592293110705685  # 0x94D049BB133111EB
BLOCK = 64  # numbers per row hashed at once


def _shift_right(x: Word, bits: int) -> Word:
    """Logical right shift of int64 (torch's >> is arithmetic on negative values)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _int64(x: Word) -> Word:
    """`x` wrapped to int64 as tensor arithmetic wraps it (a tensor already is)."""
    if isinstance(x, torch.Tensor):
        return x
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


def mix64(x: Word) -> Word:
    """SplitMix64's output function: a bijection of 64-bit words with full avalanche; on an
    int64 tensor, or on one Python int with the same bits (a key hashed on the host)."""
    x = _int64((x ^ _shift_right(x, 30)) * _MUL1)
    x = _int64((x ^ _shift_right(x, 27)) * _MUL2)
    return x ^ _shift_right(x, 31)


def _unit(bits: torch.Tensor) -> torch.Tensor:
    """The top 53 bits of each word as a float64 in [0, 1)."""
    return _shift_right(bits, 11).double() * (1.0 / (1 << 53))


class RowStreams:
    """One uniform stream per row, keyed by the row's seed.

    Row r's counter is origin[r] + offset[r]: `_block[r, k]` holds its number at index
    origin[r] + k, and `_room` is how many more numbers every row can take from the block
    (known on the host: a call of n numbers advances a row by at most n)."""

    def __init__(self, seeds: torch.Tensor | list[int], device: torch.device | str = "cpu"):
        if isinstance(seeds, torch.Tensor):
            seeds = seeds.to(device=device, dtype=torch.int64).reshape(-1)
            self.keys = mix64(seeds * _GOLDEN + 1)
        else:  # hashed on the host: one transfer instead of a dozen device ops a batch
            keys = [mix64(_int64(int(s) * _GOLDEN + 1)) for s in seeds]
            self.keys = torch.tensor(keys, dtype=torch.int64, device=device)
        self._origin = torch.zeros_like(self.keys)
        self._offset = torch.zeros_like(self.keys)
        self._block: torch.Tensor | None = None
        self._room = 0

    @property
    def device(self) -> torch.device:
        return self.keys.device

    @property
    def counters(self) -> torch.Tensor:
        """(rows,) how many numbers each row has drawn so far."""
        return self._origin + self._offset

    def __len__(self) -> int:
        return len(self.keys)

    def uniform(self, n: int = 1, counts: torch.Tensor | None = None) -> torch.Tensor:
        """(rows, n) float64 uniforms in [0, 1); row r's counter advances by counts[r]
        (default n; each in 0..n), so draws a row did not use are drawn again by its next
        call."""
        draws = self.peek(n)
        self.advance(n, counts)
        return draws

    def peek(self, n: int = 1) -> torch.Tensor:
        """(rows, n) the numbers the next `uniform(n)` returns, no counter moved: a draw
        made where its rows are not yet known (inside a captured forward, before the
        policy's rule decides who drafts), then taken with `advance`."""
        block = self._block
        if block is None or n > self._room:
            block = self._refill(n)
        index = self._offset.unsqueeze(1)
        if n != 1:
            index = index + torch.arange(n, device=self.device)
        return block.gather(1, index)

    def advance(self, n: int, counts: torch.Tensor | None = None) -> None:
        """Take what `peek(n)` showed: row r's counter moves by counts[r] (default n; integer
        or bool counts, a bool adding as 0 / 1 without a cast)."""
        self._offset = self._offset + (n if counts is None else counts)
        self._room -= n

    def grid(self, n: int, counts: torch.Tensor | None = None) -> torch.Tensor:
        """(rows, n) uniforms for one wide draw (MTAD's Gumbel noise over beams x vocabulary):
        the row's next number keys a second stream of n, and the counter advances by one."""
        key = mix64(self.keys + self.counters * _GOLDEN)
        self.advance(1, counts)
        index = torch.arange(n, device=self.device)
        return _unit(mix64(key[:, None] + (index + 1) * _GOLDEN))

    def select(self, rows: torch.Tensor) -> RowStreams:
        """The streams of these rows (finished rows leave the batch; MTAD widens it)."""
        out = RowStreams.__new__(RowStreams)
        out.keys, out._origin, out._offset = self.keys[rows], self._origin[rows], self._offset[rows]
        out._block = None if self._block is None else self._block[rows]
        out._room = self._room
        return out

    def _refill(self, n: int) -> torch.Tensor:
        """Hash every row's next max(BLOCK, n) numbers, from its counter on."""
        size = max(BLOCK, n)
        self._origin = self.counters
        self._offset = torch.zeros_like(self._origin)
        index = self._origin[:, None] + torch.arange(size, device=self.device)
        self._block = _unit(mix64(self.keys[:, None] + index * _GOLDEN))
        self._room = size
        return self._block
