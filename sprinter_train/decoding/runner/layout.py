"""What one runner's forwards run through, every choice already made (`RunnerLayout`).

The settings (`decoding.static_cache`, `compile`, `capture`, ..., and what a model and a
device allow) are resolved into a layout in one place, `decoding.builder.resolve_layout`;
the runner and its backends only read the fields here, so no two of them can decide a
layout differently (one once chose capture by itself, another reconfigured the static
backend it wrapped).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sprinter_train.core.compile_cache import CompileCache

Kind = Literal["lean", "dynamic", "static"]


@dataclass(frozen=True)
class RunnerLayout:
    """One role's layout, fully resolved.

    - `backend`: `lean` (the distilled draft through `LeanDraft`), `dynamic` (the model's own
      forward over a growing cache) or `static` (the body over preallocated buffers).
    - `compiled`: a static body under `torch.compile` (`runner.compile.compiled_step`).
    - `captured`: a static forward replayed from graphs captured by hand
      (`capture.CapturedBackend`); `coarse_spans` goes with it, since a graph records one
      attention span: powers of two keep the spans, so the graphs, few.
    - `reduce_overhead`: compiled with torch's own CUDA graphs (`reduce-overhead`: on CUDA,
      not captured by hand), which record a graph per concrete shape.
    - `prefills`: a static layout fills an empty cache through its own step (not under
      `reduce_overhead`, where every prompt width would record a CUDA graph).
    - `shrink_rows`: a static cache's row bucket shrinks as rows leave (not compiled on a
      GPU, where inert rows cost next to nothing and a new bucket a new graph).
    - `min_capacity`: the slots a static cache starts with at least (fewer shapes).
    - `padded_prefill`, `prefill_tokens`: how prompts are grouped (`runner.prefill_groups`);
      `prefill_tokens` bounds a padded prefill's forwards only (None: not given, which
      `resolve_layout` allows only where the prefill goes by length).
    - `compile_cache`: where a compiled step keeps its graphs and torch its on-disk caches
      (None: the layout names none; steps compile plainly and torch's caches stay as the
      process has them).
    """

    backend: Kind
    compiled: bool
    captured: bool
    reduce_overhead: bool
    coarse_spans: bool
    prefills: bool
    shrink_rows: bool
    min_capacity: int
    padded_prefill: bool
    prefill_tokens: int | None
    compile_cache: CompileCache | None

    @property
    def saved_steps(self) -> Path | None:
        """The compile-cache folder a compiled step keeps its graphs in (None: none, the
        step compiles plainly)."""
        return None if self.compile_cache is None else self.compile_cache.folder
