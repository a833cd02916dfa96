"""A causal LM over a batch of rows, each behind its own part of a shared KV cache.

One forward (a `ForwardRequest`) appends a block of tokens (counts[r] of them for row r, the
rest of the block empty) and returns the logits and hidden states only at the positions the
request keeps: a full-vocabulary head over every fed position would cost as much as the
body. `ModelRunner` is the one front the engine talks to; how a forward runs is its
backend's business (`runner.backends`), the one its layout names (`runner.layout.RunnerLayout`,
resolved from the settings by `decoding.builder`, the only place that decides a layout):

- the distilled draft through `models.lean.LeanDraft` (`LeanBackend`), which can hand back
  its logits over its own head's tokens only (`restricted`), all a draft step needs;
- a model that supports it over preallocated buffers (`static`, `StaticBackend`, see
  `decoding.static_cache`), its body at a few static shapes, compiled once per shape when
  `compiled`, and replayed from graphs captured by hand when `captured`
  (`graphs.CapturedBackend`, a wrapper around the static backend);
- any other model through its own forward over a growing cache (`DynamicBackend`).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from sprinter_train.core.broken_logits import nonfinite_error
from sprinter_train.decoding.cache.rows import RowCache
from sprinter_train.decoding.cache.static import KVPool, StaticRowCache
from sprinter_train.decoding.runner.backends import (
    Backend,
    DynamicBackend,
    LeanBackend,
    StaticBackend,
)
from sprinter_train.decoding.runner.capture import CapturedBackend, CapturedSteps
from sprinter_train.decoding.runner.clock import ForwardClock
from sprinter_train.decoding.runner.compile import compiled_graphs, compiled_step
from sprinter_train.decoding.runner.head import NO_POSITION, BrokenWatch, Head, broken_first
from sprinter_train.decoding.runner.layout import RunnerLayout
from sprinter_train.decoding.runner.requests import ForwardRequest, RoundRequest, RowOutput
from sprinter_train.models.body import body
from sprinter_train.models.lean import LeanDraft

__all__ = [
    "NO_POSITION",
    "ForwardRequest",
    "ModelRunner",
    "RowOutput",
    "broken_first",
    "compiled_graphs",
    "compiled_step",
    "prefill_groups",
]


class ModelRunner:
    """Feeds blocks of tokens to a `RowCache` through the backend its layout names.

    `hidden_layer` -1 is the final normed hidden state (the one the head reads); k >= 0 picks
    `hidden_states[k]`. The time inside forwards is kept by a `ForwardClock` (`seconds`,
    `forward_times`, `compile_seconds`), and broken logits (NaN, +inf, no finite value) are
    watched on the device and reported by the engine once a round (`nonfinite_position`),
    so no step waits for the device.

    `layout`: the runner's `RunnerLayout`, every choice made (`decoding.builder`'s
    `resolve_layout`: the lean draft or the static layout, compiled, captured by hand or
    under `reduce-overhead`, the prefill's grouping, the compile cache); a runner is built
    by `build_runner`, tests included, so no layout is resolved anywhere else. A static
    layout's caches reuse their buffers across generations (`kv_pool`); a prefill of one
    group (every padded one within the budget) runs through its own step
    (`StaticBackend.prefill`) where the layout `prefills`, others through the model's own
    forward (`prefill_groups`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        vocab_size: int,
        hidden_layer: int = -1,
        *,
        layout: RunnerLayout,
    ) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.hidden_layer = hidden_layer
        self.device = next(model.parameters()).device
        self.plan = layout
        self.lean = LeanDraft(model) if layout.backend == "lean" else None
        self.kv_pool = KVPool()
        self.head = Head(model, vocab_size, self.lean)
        self.watch = BrokenWatch(self.device)
        self.clock = ForwardClock(self.device, self._compile_work, lambda: self.layout)
        self.backend = self._backend()

    def _backend(self) -> Backend:
        """The one backend this runner's layout names."""
        parts = (self.model, self.head, self.hidden_layer, self.clock, self.watch)
        if self.lean is not None:
            return LeanBackend(self.lean, *parts)
        if not self.static:
            return DynamicBackend(*parts)
        static = StaticBackend(*parts, layout=self.plan, pool=self.kv_pool)
        return CapturedBackend(static) if self.plan.captured else static

    @property
    def static(self) -> bool:
        """Whether the forwards run the static layout (compiled, captured or eager)."""
        return self.plan.backend == "static"

    @property
    def compiled(self) -> bool:
        return self.plan.compiled

    @property
    def captured(self) -> bool:
        return self.plan.captured

    @property
    def min_capacity(self) -> int:
        return self.plan.min_capacity

    @property
    def padded_prefill(self) -> bool:
        return self.plan.padded_prefill

    @property
    def prefill_tokens(self) -> int | None:
        return self.plan.prefill_tokens

    def _compile_work(self) -> tuple[int, int]:
        return self.backend.compile_work()

    @property
    def layout(self) -> str:
        """How this model's forwards run: `compiled:captured`, `compiled:cudagraphs` (a GPU's
        `reduce-overhead`), `compiled:packed` (a CPU's prepacked linears, see
        `compiled.compiled_step`), `static:captured`, `static`, `lean` or `dynamic`."""
        return self.backend.name

    @property
    def support(self) -> torch.Tensor | None:
        """A restricted head's ids on the shared vocabulary, ascending; None: a full head."""
        return self.head.support

    @property
    def graphs(self) -> CapturedSteps | None:
        """The captured graphs of a captured runner."""
        return self.backend.graphs if isinstance(self.backend, CapturedBackend) else None

    @property
    def captures_rounds(self) -> bool:
        """Whether a draft round of fixed length runs as one graph (`run_round`)."""
        return isinstance(self.backend, CapturedBackend)

    @torch.inference_mode()
    def run_round(
        self, cache: RowCache, request: RoundRequest
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A draft round in one graph (`draft_graph`; a runner that `captures_rounds`)."""
        assert isinstance(self.backend, CapturedBackend) and isinstance(cache, StaticRowCache)
        return self.backend.run_round(cache, request)

    @property
    def seconds(self) -> float:
        """Time inside this model's forwards so far (drains the CUDA event list)."""
        return self.clock.seconds

    @property
    def prefill_seconds(self) -> float:
        """The part of `seconds` spent in `prime`, filling empty caches with prompts."""
        return self.clock.prefill_seconds

    @property
    def compile_seconds(self) -> float:
        """Time spent compiling and capturing new shapes (not in `seconds`)."""
        return self.clock.compile_seconds

    @property
    def compiles(self) -> int:
        """Graphs dynamo compiled in this runner's forwards."""
        return self.clock.compiles

    def forward_times(self) -> list[tuple[int, int, float]]:
        """See `ForwardClock.forward_times`: reading takes them."""
        return self.clock.forward_times()

    def new_cache(self, rows: int, capacity: int = 0) -> RowCache:
        """An empty cache for `rows` rows of this runner's layout; `capacity`: the slots a
        static cache starts with (it grows when a block needs more)."""
        return self.backend.new_cache(rows, capacity)

    @torch.inference_mode()
    def prime(self, cache: RowCache, rows: list[list[int]]) -> None:
        """Fill an empty cache with each row's tokens, a few rows a forward (`prefill_groups`),
        then lay the groups' caches side by side (short rows end in empty slots); one group
        on a static layout: one block through its step, straight into the buffers.

        Rows are right-padded to their group's longest prompt with no attention mask: under
        the causal mask a prompt token sees only the tokens before it, never the padding
        after it, so padding changes no real position's arithmetic (only the matmul shapes),
        and the padded slots are marked empty."""
        if cache.slots:
            raise ValueError("prime fills an empty cache; this one holds tokens already")
        lengths = [len(tokens) for tokens in rows]
        grouped = prefill_groups(lengths, self.padded_prefill, self.prefill_tokens)
        with self.clock.timed(prefill=True):
            if self.backend.prefills and len(grouped) == 1:  # the static layouts' own step
                self.backend.prefill(cache, self.right_padded(rows), lengths)
                return
            groups = []
            for members in grouped:
                ids = self.right_padded([rows[r] for r in members])
                _, _, kv = body(self.model, ids, past_key_values=DynamicCache(), use_cache=True)
                groups.append((members, kv))
            cache.absorb(groups, lengths)

    def right_padded(self, rows: list[list[int]]) -> torch.Tensor:
        """(rows, longest) token ids on the device, each row right-padded with zeros."""
        width = max(len(tokens) for tokens in rows)
        padded = [tokens + [0] * (width - len(tokens)) for tokens in rows]
        return torch.as_tensor(padded, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def run(self, cache: RowCache, request: ForwardRequest) -> RowOutput:
        """One forward: see `ForwardRequest` for what it asks and `RowOutput` for what comes
        back (warped and drawn in the graph only by a captured runner)."""
        return self.backend.run(cache, request)

    def nonfinite_position(self) -> torch.Tensor:
        """() on the device: the lowest position whose next-token logits were broken since the
        last call, or NO_POSITION; resets. The engine sends it home in each round's one
        transfer."""
        return self.watch.take()

    @staticmethod
    def raise_nonfinite(roles: list[str], positions: list[int]) -> None:
        """Stop on the first role whose `nonfinite_position` came home as a position."""
        for role, position in zip(roles, positions, strict=True):
            if position < NO_POSITION:
                raise nonfinite_error(
                    role, f"at position {position} (the next-token distribution after it)"
                )


def prefill_groups(lengths: list[int], padded: bool, budget: int | None) -> list[list[int]]:
    """The rows (indices into `lengths`, empty prompts left out) each prefill forward takes.

    By length (`padded` false, a CPU's default): rows of one length together, no padding: a
    CPU's prefill is compute-bound, so a row should cost its own length, and a batch padded
    to its longest prompt costs several times the prompts themselves. Padded (a GPU's
    default): an eager forward there is launch-bound, about one price at any length, so one
    forward per distinct length would cost more than the decode; instead the rows, longest
    first, fill forwards of at most `budget` padded tokens (docs/results/design-figures.md, "Prefill on a GPU");
    `budget` is read there only (`decoding.prefill_tokens`: `resolve_layout` requires it where
    the prefill is padded)."""
    present = [r for r, n in enumerate(lengths) if n]
    if not padded:
        by_length: dict[int, list[int]] = {}
        for r in present:
            by_length.setdefault(lengths[r], []).append(r)
        return list(by_length.values())
    if budget is None:
        raise ValueError("a padded prefill needs its budget (decoding.prefill_tokens)")
    groups: list[list[int]] = []
    for r in sorted(present, key=lambda r: -lengths[r]):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
            groups[-1].append(r)
        else:
            groups.append([r])
    return groups
