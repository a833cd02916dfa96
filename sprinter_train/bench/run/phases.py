"""How long each of the bench's untimed set-up phases took and what it compiled: the latency
profile, alpha with the profile's check, hf_static's compile and each method's warm-up per
batch size (results.json's `setup_phases`; results.md's warm-up section shows them,
`report.phase_lines`).

A run's compile time hides in these phases (never in tokens/s), so they say where it went:
a method whose warm-up compiles graphs where the others compile none runs shapes they do
not, or recompiled shapes they had compiled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sprinter_train.core.compile_cache import compile_counters, dynamo_seconds
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.runner.compile import compiled_graphs

Phases = list[dict[str, Any]]  # one record per phase, in the order they ran


def runner_compile_seconds(engine: Engine) -> Callable[[], float]:
    """The engine's runners' compile and capture seconds so far (what their clocks moved out
    of the forwards): a phase of the engine's compiles."""
    return lambda: sum(r.compile_seconds for r in engine.present_runners.values())


@contextmanager
def phase(
    phases: Phases, name: str, compile_seconds: Callable[[], float] = dynamo_seconds, **about: Any
) -> Iterator[None]:
    """Append to `phases` what the block took: `seconds` (wall), `compile_s` (the growth of
    `compile_seconds`: dynamo's own frame-compile tally unless told, e.g. the engine's
    runners, whose captures count too), `graphs` (graphs dynamo compiled in this process)
    and the on-disk compile cache's `cache_hits` and `cache_misses`; `about`: more fields
    (the method, the batch size)."""
    began, compiling = time.perf_counter(), compile_seconds()
    graphs, counters = compiled_graphs(), compile_counters()
    yield
    after = compile_counters()
    phases.append(
        {
            "phase": name,
            **about,
            "seconds": round(time.perf_counter() - began, 3),
            "compile_s": round(compile_seconds() - compiling, 3),
            "graphs": compiled_graphs() - graphs,
            "cache_hits": after["hits"] - counters["hits"],
            "cache_misses": after["misses"] - counters["misses"],
        }
    )
