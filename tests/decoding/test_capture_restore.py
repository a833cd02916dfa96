"""A capture that fails to record leaves the cache as it found it (trust issue #52, item 11).

On the host-played capture (`graphs.HostGraph`, the CPU tests' CUDA graph) the recording
runs the step once more on the cache the first call just advanced; a block that then runs
past the capacity fails mid-way, and the capture is dropped with a warning. Whatever the
failed attempt wrote (slot-map marks, lengths, keys, values, write counters) must be put
back, or the slot map holds marks for slots no row was fed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch

from sprinter_train.decoding.builder import build_runner
from sprinter_train.decoding.runner import capture as graphs
from sprinter_train.decoding.runner.requests import ForwardRequest
from tests.decoding_helpers import PROMPTS, VOCAB, tiny_trio


class Snapshotting(graphs.HostGraph):
    """The host-played capture, keeping a copy of the cache's state as each capture began."""

    before: list[list[torch.Tensor]] = []

    def capture(self, run: Callable[[], Any], state: Any) -> Any:
        Snapshotting.before.append([t.clone() for t in state.written])
        return super().capture(run, state)


@pytest.fixture
def snapshotting(monkeypatch) -> type[Snapshotting]:
    monkeypatch.setattr(graphs, "CudaGraph", Snapshotting)
    monkeypatch.setattr(Snapshotting, "before", [])
    return Snapshotting


def test_a_capture_that_overflows_the_cache_restores_its_state(snapshotting, caplog) -> None:
    runner = build_runner(tiny_trio()["target"], VOCAB, {"static": True, "captured": True})
    cache = runner.new_cache(2)
    runner.prime(cache, PROMPTS[:2])
    # fits once; the capture's re-run marks the slots up to the capacity, then runs past it
    width = (cache.capacity - cache.slots) // 2 + 8
    assert cache.slots + width < cache.capacity < cache.slots + 2 * width
    ids = torch.full((2, width), 3)
    counts = torch.tensor([width, width - 5])
    keep = torch.zeros((2, 1), dtype=torch.long)
    with caplog.at_level(logging.WARNING, logger=graphs.__name__):
        runner.run(cache, ForwardRequest(ids, counts, keep))
    assert "out of bounds" in caplog.text and "runs uncaptured" in caplog.text
    assert runner.graphs.captures == 0 and len(snapshotting.before) == 1
    kv = cache.kv
    for now, was in zip(kv.written, snapshotting.before[0], strict=True):
        assert torch.equal(now, was)
    # and so every row has as many slots marked as it was fed
    assert torch.equal((kv.position >= 0).sum(1), kv.lengths)
