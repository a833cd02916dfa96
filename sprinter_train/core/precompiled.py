"""Compiled graphs kept on disk with their guards, so that a later process skips tracing.

Inductor's caches (`core.compile_cache`) spare a later process the code generation, but
dynamo still traces every frame again to find the cached graph's key, and on a CPU that
tracing is most of what a warm start pays (docs/results/compile-cpu.md). torch's AOT compile
(`torch.compile(...).aot_compile`) captures one full graph together with its guards and its
compiled code as a function that can be saved; a later process loads it, checks its guards
against a call and runs it without tracing anything.

`PrecompiledStep` runs one module's forward that way. A call runs the first of the step's
graphs whose guards hold for it. A call that none of them takes compiles a new graph (the
dimensions named in `dynamic_sources` symbolic), saves it in the step's folder and keeps it.
The first call loads the graphs the folder already holds, so a later process starts with
every graph an earlier one compiled.

The saved guards are the ones dynamo can serialise (torch's own filter for AOT compile,
which also drops those derived from an object's identity): the tensors' shapes, strides,
dtypes, devices and dispatch keys, and the python values the forward reads. They do not
cover which code was traced, so the folder's name must stand for it: the caller names it
after the model's architecture, its sizes and the sources traced (`decoding.runner.compile`).

Everything runs in inference mode: a guard's expected dispatch keys are computed, when the
guards are loaded, in the grad mode of that moment, so loading, compiling and calling in one
mode keeps a graph saved by one process valid for the next.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sprinter_train.core.compile_cache import note_precompiled

log = logging.getLogger(__name__)
SUFFIX = ".graph"  # a saved graph; the temporary file of a save cut short has another name
STALE_S = 3600.0  # a temporary file this old is a save cut short, not one under way
MANY = 4  # graphs compiled by one step in one process past which each new one is worth a warning


def portable_guards(entries: Sequence[Any]) -> list[bool]:
    """Dynamo's guard filter for a graph meant to be saved: keep the guards it can
    serialise, drop those on globals and on an object's identity (what the folder's name
    stands for instead)."""
    from torch._dynamo.guards import CheckFunctionManager

    unsupported = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    return [
        not (
            entry.is_global
            or entry.guard_type in unsupported
            or unsupported.intersection(entry.derived_guard_types)
        )
        for entry in entries
    ]


@dataclass
class Kept:
    """One graph of a step: whether it came from the folder, and whether it has run."""

    graph: Any
    loaded: bool
    used: bool = False


# a folder's graphs, shared by every step of this process that keeps its graphs there (a
# target and its companion copy): a graph reads the module it is called with, so one
# compiled for either serves both, and the folder is loaded once
_SHELVES: dict[Path, list[Kept]] = {}


class PrecompiledStep:
    """`module`'s forward as saved, guarded graphs (see the module docstring); `folder`:
    where this step's graphs are kept (None: in memory only). A graph torch cannot compile
    to be saved (a guard it cannot serialise, on some architecture) turns the step into a
    plain `torch.compile` of the forward, with a warning: slower to start, the same tokens;
    a fault of the forward itself is raised by that compile."""

    def __init__(
        self,
        module: torch.nn.Module,
        folder: Path | None,
        dynamic_sources: str,
        backend: str = "inductor",
        plain: Callable[[], Any] | None = None,
    ) -> None:
        self.module = module
        self.backend = backend
        # makes the plain compile to fall back on (default: of the module, on `backend`)
        self.plain = plain or functools.partial(
            torch.compile, module, fullgraph=True, dynamic=None, backend=backend
        )
        self.folder = folder
        self.dynamic_sources = dynamic_sources
        self.kept: list[Kept] = []
        self.compiled = 0  # graphs this step compiled
        self.fallback: Any = None  # the plain compile, once a graph could not be saved
        self._opened = False

    def __call__(self, *args: Any) -> Any:
        if self.fallback is not None:
            return self.fallback(*args)
        with torch.inference_mode():
            if not self._opened:
                self._opened = True
                self.kept = self._shelf()
            for index, kept in enumerate(self.kept):
                if kept.graph.guard_check(self.module, *args):
                    self._first_use(index)
                    return kept.graph.fn(self.module, *args)
            graph = self._compile(args)
            if graph is not None:
                return graph.fn(self.module, *args)
        return self.fallback(*args)

    def _first_use(self, index: int) -> None:
        """Count a loaded graph's first run as a cache hit, and move the graph to the front:
        the next call of the same shape checks its guards first."""
        kept = self.kept[index]
        if not kept.used:
            kept.used = True
            if kept.loaded:
                note_precompiled(hits=1)
        if index:
            self.kept.insert(0, self.kept.pop(index))

    def _shelf(self) -> list[Kept]:
        """The folder's graphs, loaded by the first step of the process that opens it."""
        if self.folder is None:
            return []
        if self.folder not in _SHELVES:
            _SHELVES[self.folder] = load_folder(self.folder)
        return _SHELVES[self.folder]

    def _compile(self, args: tuple[Any, ...]) -> Any:
        """Trace and compile a graph for `args`, save it in the folder and keep it last;
        None when dynamo cannot save it (the step falls back to a plain compile)."""
        started = time.perf_counter()
        try:  # an older torch without AOT compile, or without this option, falls back too
            compiler = torch.compile(
                self.module.forward,
                fullgraph=True,
                dynamic=None,
                backend=self.backend,
                options={"guard_filter_fn": portable_guards},
            )
            with torch.compiler.config.patch(dynamic_sources=self.dynamic_sources):
                graph = compiler.aot_compile((args, {}))
            if not (callable(graph.fn) and graph.guard_check(self.module, *args)):
                raise RuntimeError("the graph's guards fail the inputs it was compiled for")
            self._save(graph)
        except Exception as error:  # noqa: BLE001 - the plain compile re-raises a real fault
            log.warning(
                "%s: its compiled graphs cannot be saved (%s: %s); compiling it in every "
                "process instead",
                type(self.module).__name__,
                type(error).__name__,
                error,
            )
            self.fallback = self.plain()
            note_precompiled(seconds=time.perf_counter() - started)
            return None
        self.compiled += 1
        if self.compiled > MANY:
            log.warning(
                "%s compiled its graph %d in this process: a dimension its guards hold "
                "static may be changing",
                self.folder or type(self.module).__name__,
                self.compiled,
            )
        self.kept.append(Kept(graph, loaded=False, used=True))
        note_precompiled(misses=1, seconds=time.perf_counter() - started)
        return graph

    def _save(self, graph: Any) -> None:
        """Write `graph` to the folder under a name of its own (several processes may share
        the folder); a folder that cannot be written costs the next process a compile, not
        this one its graph."""
        if self.folder is None:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            graph.save_compiled_function(str(self.folder / f"{uuid.uuid4().hex}{SUFFIX}"))
        except OSError as error:
            log.warning("compile cache: could not save a graph in %s (%s)", self.folder, error)


def load_folder(folder: Path) -> list[Kept]:
    """Every graph saved in `folder`, oldest first. One that cannot be loaded (another
    machine's, a file cut short) is removed, and compiled again when a call needs it; so is
    the temporary file of a save killed before its rename, once it is `STALE_S` old."""
    if not folder.is_dir():
        return []
    started = time.perf_counter()
    for path in folder.iterdir():  # the temporary files of saves cut short
        if path.suffix != SUFFIX and path.stat().st_mtime < time.time() - STALE_S:
            path.unlink(missing_ok=True)
    kept = []
    for path in sorted(folder.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime):
        try:
            with path.open("rb") as handle:
                graph = torch.compiler.load_compiled_function(handle)
        except Exception as error:  # noqa: BLE001 - any unreadable graph is compiled again
            log.warning("compile cache: removed %s, which failed to load (%s)", path, error)
            path.unlink(missing_ok=True)
            continue
        kept.append(Kept(graph, loaded=True))
    note_precompiled(loaded=len(kept), seconds=time.perf_counter() - started)
    return kept
