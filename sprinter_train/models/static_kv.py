"""The lean forward's KV cache: per-layer key and value buffers written in place, grown by
doubling when a block does not fit.

`StaticKV` offers the parts of `transformers.DynamicCache` the decoding engine's row cache
uses (`layers[i].keys / .values`, `update`, `get_seq_length`, `batch_select_indices`), so
the row cache keeps, crops and packs it as it does a dynamic one."""

from __future__ import annotations

import torch

MIN_CAPACITY = 256  # slots a fresh buffer holds; it doubles when a block does not fit


class KVLayer:
    """One layer's keys and values: (rows, kv heads, capacity, head dim) buffers whose first
    slots are filled. `keys` / `values` are views of the filled slots; assigning one (as
    `RowCache.pack` does, keys then values) writes the new contents into its buffer. The
    buffers are inference tensors, so every write runs in inference mode."""

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor | None] = [None, None]  # keys, values
        self.filled = [0, 0]

    @property
    def length(self) -> int:
        return self.filled[0]

    @property
    def keys(self) -> torch.Tensor:
        return self._view(0)

    @keys.setter
    def keys(self, contents: torch.Tensor) -> None:
        self._write(0, contents, 0)

    @property
    def values(self) -> torch.Tensor:
        return self._view(1)

    @values.setter
    def values(self, contents: torch.Tensor) -> None:
        self._write(1, contents, 0)

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a block of (rows, kv heads, width, head dim) after the filled slots; return
        every filled slot's keys and values (views, no copy)."""
        self._write(0, keys, self.filled[0])
        self._write(1, values, self.filled[1])
        return self._view(0), self._view(1)

    def select(self, rows: torch.Tensor) -> None:
        with torch.inference_mode():
            self.buffers = [None if b is None else b[rows] for b in self.buffers]

    def _view(self, which: int) -> torch.Tensor:
        buffer = self.buffers[which]
        assert buffer is not None, "an empty layer holds no keys or values"
        return buffer[:, :, : self.filled[which]]

    def _write(self, which: int, contents: torch.Tensor, start: int) -> None:
        """Put contents in slots start.. and mark everything past them empty; a buffer too
        small (or of other rows or dtype) is replaced by one of twice the capacity that keeps
        the slots before `start`."""
        if not torch.is_inference_mode_enabled():
            with torch.inference_mode():
                return self._write(which, contents, start)
        end = start + contents.shape[2]
        buffer = self.buffers[which]
        if (
            buffer is None
            or end > buffer.shape[2]
            or buffer.shape[0] != contents.shape[0]
            or buffer.dtype != contents.dtype
        ):
            rows, heads, _, dim = contents.shape
            capacity = max(end, 2 * (0 if buffer is None else buffer.shape[2]), MIN_CAPACITY)
            grown = contents.new_zeros((rows, heads, capacity, dim))
            if start:
                grown[:, :, :start] = buffer[:, :, :start]  # type: ignore[index]
            self.buffers[which] = buffer = grown
        buffer[:, :, start:end].copy_(contents)
        self.filled[which] = end


class StaticKV:
    """Preallocated per-layer key/value buffers with DynamicCache's interface as the row cache
    uses it; every layer holds the same number of slots."""

    def __init__(self) -> None:
        self.layers: list[KVLayer] = []

    def get_seq_length(self, layer: int = 0) -> int:
        return self.layers[layer].length if layer < len(self.layers) else 0

    def update(
        self, keys: torch.Tensor, values: torch.Tensor, layer: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        while len(self.layers) <= layer:
            self.layers.append(KVLayer())
        return self.layers[layer].append(keys, values)

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        for layer in self.layers:
            layer.select(rows)
