"""Per-row random streams that live on the model's device and never sync the host.

A batched decoder must give every row the tokens it would get decoded alone: its draws may
depend only on its own seed and on how many numbers it has drawn so far, never on its
batch-mates. `RowStreams` is SplitMix64 (Steele et al. 2014) evaluated as a counter-based
generator: draw k of row r is mix(key_r + (counter_r + k) * golden), vectorised over rows in
int64 tensor arithmetic (which wraps modulo 2^64), so one call serves the whole batch and a
row that draws nothing this step keeps its counter.
"""

from __future__ import annotations

import torch

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
_MUL1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MUL2 = -7723592293110705685  # 0x94D049BB133111EB


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic on negative values)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output function: a bijection of 64-bit words with full avalanche."""
    x = (x ^ _shift_right(x, 30)) * _MUL1
    x = (x ^ _shift_right(x, 27)) * _MUL2
    return x ^ _shift_right(x, 31)


class RowStreams:
    """One uniform stream per row, keyed by the row's seed."""

    def __init__(self, seeds: torch.Tensor | list[int], device: torch.device | str = "cpu"):
        seeds = torch.as_tensor(seeds, dtype=torch.int64, device=device).reshape(-1)
        self.keys = mix64(seeds * _GOLDEN + 1)
        self.counters = torch.zeros_like(seeds)

    @property
    def device(self) -> torch.device:
        return self.keys.device

    def __len__(self) -> int:
        return len(self.keys)

    def uniform(self, n: int = 1, counts: torch.Tensor | None = None) -> torch.Tensor:
        """(rows, n) float64 uniforms in [0, 1); row r's counter advances by counts[r]
        (default n), so draws a row did not use are drawn again by its next call."""
        index = self.counters[:, None] + torch.arange(n, device=self.device)
        bits = mix64(self.keys[:, None] + index * _GOLDEN)
        self.counters = self.counters + (n if counts is None else counts.to(torch.int64))
        return _shift_right(bits, 11).double() * (1.0 / (1 << 53))

    def grid(self, n: int, counts: torch.Tensor | None = None) -> torch.Tensor:
        """(rows, n) uniforms for one wide draw (MTAD's Gumbel noise over beams x vocabulary):
        the row's next number keys a second stream of n, and the counter advances by one."""
        key = mix64(self.keys + self.counters * _GOLDEN)
        self.counters = self.counters + (1 if counts is None else counts.to(torch.int64))
        index = torch.arange(n, device=self.device)
        bits = mix64(key[:, None] + (index + 1) * _GOLDEN)
        return _shift_right(bits, 11).double() * (1.0 / (1 << 53))

    def select(self, rows: torch.Tensor) -> RowStreams:
        """The streams of these rows (finished rows leave the batch; MTAD widens it)."""
        out = RowStreams.__new__(RowStreams)
        out.keys, out.counters = self.keys[rows], self.counters[rows]
        return out
