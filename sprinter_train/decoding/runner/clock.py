"""The time a runner's forwards take, kept apart from the time spent compiling them.

On CPU the wall clock of each forward is summed; on CUDA each forward records a pair of
events, read only when asked (`seconds` drains them, `forward_times` takes those already
done), so timing never makes a step wait for the device. A forward that compiled or
captured a graph is compile time (`compile_seconds`), never a forward's time: the bench's
breakdown and the policies' cost models read the forwards alone.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from sprinter_train.core.runtime import synchronize

log = logging.getLogger(__name__)

# (graphs compiled or loaded for this runner so far, CUDA graphs it captured): see
# `Backend.compile_work`
CompileWork = Callable[[], tuple[int, int]]


class ForwardClock:
    """Times a runner's forwards and prefills; `work` counts what its backend compiled and
    captured, so a block that did either is moved to compile time."""

    def __init__(self, device: torch.device, work: CompileWork, name: Callable[[], str]) -> None:
        self.device = device
        self.work = work
        self.name = name  # the layout, for the warning about a recompile
        self.compile_seconds = 0.0  # first calls of new compiled shapes (not in `seconds`)
        self.compiles = 0  # graphs compiled (or loaded) in this runner's forwards
        self._cpu_seconds = 0.0
        self._cpu_prefill = 0.0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._prefill_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        # (rows, block width, seconds or CUDA events) of the latest forwards (not prefills)
        self._shapes: deque[tuple[int, int, Any]] = deque(maxlen=256)

    @property
    def seconds(self) -> float:
        """Time inside the forwards so far (drains the CUDA event list)."""
        self._cpu_seconds += self._drained(self._events)
        return self._cpu_seconds

    @property
    def prefill_seconds(self) -> float:
        """The part of `seconds` spent filling empty caches with prompts (drains its CUDA
        events): a decode call's cost is the rest over the calls."""
        self._cpu_prefill += self._drained(self._prefill_events)
        return self._cpu_prefill

    def _drained(self, events: list[tuple[torch.cuda.Event, torch.cuda.Event]]) -> float:
        """Seconds between each pair of `events`, once the device is done; the list emptied."""
        if not events:
            return 0.0
        synchronize(self.device)
        seconds = sum(a.elapsed_time(b) for a, b in events) / 1000.0
        events.clear()
        return seconds

    def forward_times(self) -> list[tuple[int, int, float]]:
        """(rows, block width, seconds) of each forward since the last call whose time is
        known: on CUDA, those whose end event has completed (after a round's transfer, all of
        that round's), so reading them never waits for the device. Reading takes them: the
        engine's `Timings` is the one reader."""
        done = []
        while self._shapes:
            rows, width, timing = self._shapes[0]
            if isinstance(timing, tuple):
                start, end, forwards = timing
                if not end.query():
                    break
                timing = start.elapsed_time(end) / 1000.0 / forwards
            done.append((rows, width, float(timing)))
            self._shapes.popleft()
        return done

    @contextmanager
    def timed(
        self,
        shape: tuple[int, int] | None = None,
        compiling: bool = False,
        forwards: int = 1,
        prefill: bool = False,
    ) -> Iterator[None]:
        """Time the block: CUDA events on a GPU (read later, no sync), the wall clock on CPU;
        a forward's (rows, width) `shape` is kept with its time for `forward_times`; a block
        of several `forwards` of that shape (a draft round in one graph) keeps each with its
        share of the time, so the cost model still prices one forward.
        `prefill`: the block fills an empty cache (also kept as `prefill_seconds`).
        `compiling`: the block compiles a new shape; its wall time goes to `compile_seconds`
        alone (after a sync, as a warm-up is timed). A block that compiled or captured a
        graph unforeseen is moved there too (with a warning when dynamo recompiled a shape
        it knew, never for a prefill, whose width is a prompt's): a compile is never timed
        as a forward."""
        work = self.work()
        if compiling:
            if not self.compiles:  # the first graph: say why the progress stands still
                log.info(
                    "%s: compiling its step for a new shape (rows, width %s); later "
                    "processes read the graphs from decoding.compile_cache",
                    self.name(),
                    shape,
                )
            synchronize(self.device)
            began = time.perf_counter()
            yield
            self._add_compile(began, work)
            return
        start = torch.cuda.Event(enable_timing=True) if self.device.type == "cuda" else None
        if start is not None:
            start.record()
        began = time.perf_counter()
        yield
        after = self.work()
        if after != work:
            if after[0] > work[0] and not prefill:  # a prompt's width is new by nature
                log.warning(
                    "%s recompiled a shape it had compiled (rows, width %s)", self.name(), shape
                )
            self._add_compile(began, work)
            return
        if start is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((start, end))
            if prefill:
                self._prefill_events.append((start, end))
            if shape is not None:
                self._shapes.extend([(*shape, (start, end, forwards))] * forwards)
        else:
            elapsed = time.perf_counter() - began
            self._cpu_seconds += elapsed
            self._cpu_prefill += elapsed if prefill else 0.0
            if shape is not None:
                self._shapes.extend([(*shape, elapsed / forwards)] * forwards)

    def _add_compile(self, began: float, work: tuple[int, int]) -> None:
        """Count the block since `began` (once the device is done) as compile time, and the
        graphs dynamo compiled in it (`work`: the count before)."""
        synchronize(self.device)
        seconds = time.perf_counter() - began
        graphs = self.work()[0] - work[0]
        self.compile_seconds += seconds
        self.compiles += graphs
        if graphs:
            log.info("%s: compiled or loaded %d graph(s) in %.1f s", self.name(), graphs, seconds)
