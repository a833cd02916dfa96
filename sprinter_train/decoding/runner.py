"""A causal LM over a batch of rows, each behind its own part of a shared KV cache.

One forward appends a block of tokens (counts[r] of them for row r, the rest of the block
empty) and returns the logits and hidden states only at the positions the caller asks for:
a full-vocabulary head over every fed position would cost as much as the body. The
distilled draft runs through `models.lean.LeanDraft` (the same arithmetic without Hugging
Face's per-step mask and cache machinery) and can hand back its logits over its own head's
tokens only (`restricted`), which is all a draft step needs. A Hugging Face model may instead
keep its keys and values in preallocated buffers (`static`, see `decoding.static_cache`), and
its body then runs at a few static shapes, compiled once per shape when `compiled`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from sprinter_train.core.broken_logits import broken_rows, nonfinite_error
from sprinter_train.core.runtime import synchronize
from sprinter_train.core.sampling import SamplingConfig, warp_probs
from sprinter_train.decoding.after_warp import AfterWarp
from sprinter_train.decoding.cache import RowCache
from sprinter_train.decoding.graphs import CapturedSteps
from sprinter_train.decoding.static_cache import KVPool, StaticRowCache, supports_static
from sprinter_train.models.body import body, head_logits
from sprinter_train.models.lean import LeanDraft, StaticKV, uses_lean

NO_POSITION = 2**62  # the watch's "no broken logits seen"
log = logging.getLogger(__name__)


@dataclass
class RowOutput:
    logits: torch.Tensor  # (rows, keep, V) float32 on the shared vocabulary
    hidden: torch.Tensor  # (rows, keep, d) the hidden state verifiers read
    # when set, `logits` are (rows, keep, K) over these K ascending vocabulary ids only (a
    # restricted head's tokens: every other token's logit is -inf)
    support: torch.Tensor | None = None
    # (rows, keep, d_model) the final hidden state (the head's input) at the same positions
    final: torch.Tensor | None = None
    # `logits` warped by the sampling `forward` was asked to warp with, where the runner did
    # it (in a captured graph); None: the caller warps
    probs: torch.Tensor | None = None
    # (rows,) the token of the `then` that `forward` was given (`after_warp`), drawn in the
    # captured graph (into `logits`' columns: a head index when `support` is set); None: the
    # caller draws
    drawn: torch.Tensor | None = None
    # (rows,) the drafts each row's `Check` accepted, in the captured graph; None: not checked
    accepted: torch.Tensor | None = None


class ModelRunner:
    """Feeds blocks of tokens to a `RowCache` and applies the head where logits are used.

    `hidden_layer` -1 is the final normed hidden state (the one the head reads); k >= 0 picks
    `hidden_states[k]`. On CPU the seconds inside forwards are summed for the bench's time
    breakdown; on CUDA they are measured with events, read when the caller asks (no sync).
    Broken logits (NaN, +inf, no finite value) are watched on the device and reported by the
    engine once a round (`nonfinite_position`), so no step waits for the device.
    `lean` (default: `uses_lean`, i.e. a model that supports it, unless loaded with
    `models.lean_draft=false`, or compiled: see below) runs the distilled draft's forwards
    through `LeanDraft` over a `StaticKV`; prefills still go through the model's own forward.
    On a GPU a `compiled` runner of a model with a static layout takes that layout instead of
    the lean one: the lean buffers grow step by step, so its shapes never settle (on an H100
    the eager lean draft step cost 4-7 ms in the bench, the compiled static one 0.94 ms). On
    a CPU the lean path stays: its prepacked eager step beat the compiled static one (the
    2-core CPU's bench, float32: 5.0 against 6.8 ms).
    `static`: any other model that supports it keeps its cache in a `StaticRowCache`;
    `compiled` (static only) runs its body through `torch.compile(fullgraph=True)`, one graph
    per (row bucket, width, capacity); the first call of each shape is compile time
    (`compile_seconds`), kept out of `seconds` and `forward_times`. Static caches start with
    at least `min_capacity` slots (one capacity for every generation: fewer compiled shapes),
    reuse their buffers across generations (`KVPool`) and, compiled on a GPU, keep their row
    bucket as rows leave. `captured` (default: compiled on a GPU; any static runner when true)
    replays each shape's body as a CUDA graph captured by hand (`graphs.CapturedSteps`:
    without dynamo's per-call wrappers), not through `reduce-overhead`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        vocab_size: int,
        hidden_layer: int = -1,
        lean: bool | None = None,
        static: bool = False,
        compiled: bool = False,
        min_capacity: int = 0,
        padded_prefill: bool | None = None,
        prefill_tokens: int = 1 << 16,
        captured: bool | None = None,
    ) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.hidden_layer = hidden_layer
        self.device = next(model.parameters()).device
        use_lean = uses_lean(model) if lean is None else lean
        if lean is None and compiled and static and supports_static(model):
            use_lean = use_lean and not compiled_over_lean(self.device)
        self.lean = LeanDraft(model) if use_lean else None
        self.static = static and self.lean is None and supports_static(model)
        self.compiled = compiled and self.static
        self._step: Any = self._body_step
        # on a GPU the compiled body replays as CUDA graphs captured by hand (see `graphs`)
        cuda = self.device.type == "cuda"
        self.captured = self.static and (self.compiled and cuda if captured is None else captured)
        if self.compiled:
            self._step = compiled_step(self._body_step, self.device, not self.captured)
        # the body and what the runner does with its outputs, replayed as one graph
        self._captured = CapturedSteps(self._captured_forward) if self.captured else None
        self._shapes_seen: set[tuple[int, int, int]] = set()
        self.min_capacity = min_capacity
        # see `prefill_groups`: padded by default on a GPU only
        self.padded_prefill = cuda if padded_prefill is None else padded_prefill
        self.prefill_tokens = prefill_tokens
        self.kv_pool = KVPool()
        # on a GPU a compiled cache keeps its row bucket as rows leave (inert rows cost next to
        # nothing there, a new bucket a new CUDA graph); on a CPU every row costs compute
        self.shrink_rows = not (self.compiled and cuda)
        self.compile_seconds = 0.0  # first calls of new compiled shapes (not in `seconds`)
        self.compiles = 0  # graphs dynamo compiled in this runner's forwards
        self.support: torch.Tensor | None = None  # the head's ids on the shared vocabulary
        self._head_order: torch.Tensor | None = None  # the restricted head's rows, ascending
        ids = None
        if self.lean is not None:
            ids = self.lean.head_ids
        elif hasattr(model.get_output_embeddings(), "token_ids"):
            ids = model.get_output_embeddings().token_ids
            self._head_order = ids.argsort()
            ids = ids[self._head_order]
        if ids is not None:
            self._support_size = int((ids < vocab_size).sum())  # ascending: a prefix
            self.support = ids[: self._support_size].to(self.device)
        self._cpu_seconds = 0.0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._nonfinite: torch.Tensor | None = None  # lowest position with broken logits
        self._none_broken = torch.tensor(NO_POSITION, device=self.device)
        # the same, folded in place by the captured graphs (a static address they write)
        self._broken_in_graphs: torch.Tensor | None = None
        self._replays_since_read = False  # whether they may have folded since it was read
        if self.captured:
            with torch.inference_mode():
                self._broken_in_graphs = self._none_broken.clone()
        # (rows, block width, seconds or CUDA events) of the latest forwards (not prefills)
        self._shapes: deque[tuple[int, int, Any]] = deque(maxlen=256)

    @property
    def layout(self) -> str:
        """How this model's forwards run: compiled (replayed from CUDA graphs captured by hand
        or by `reduce-overhead` on a GPU, the prepacked linears' op on a CPU: see
        `compiled_step`), static (eager), lean or dynamic."""
        if self.compiled:
            if self.captured:
                return "compiled:captured"
            return "compiled:" + ("cudagraphs" if self.device.type == "cuda" else "packed")
        if self.captured:
            return "static:captured"
        return "static" if self.static else "lean" if self.lean is not None else "dynamic"

    def new_cache(self, rows: int, capacity: int = 0) -> RowCache:
        """An empty cache for `rows` rows; `capacity`: the slots a static cache starts with
        (it grows when a block needs more)."""
        if self.static:
            return StaticRowCache(
                rows,
                self.device,
                self.model,
                max(capacity, self.min_capacity),
                pool=self.kv_pool,
                shrink=self.shrink_rows,
            )
        return RowCache(rows, self.device, None if self.lean is None else StaticKV())

    @property
    def seconds(self) -> float:
        """Time inside this model's forwards so far (drains the CUDA event list)."""
        if self._events:
            synchronize(self.device)
            self._cpu_seconds += sum(a.elapsed_time(b) for a, b in self._events) / 1000.0
            self._events.clear()
        return self._cpu_seconds

    def forward_times(self) -> list[tuple[int, int, float]]:
        """(rows, block width, seconds) of each forward since the last call whose time is
        known: on CUDA, those whose end event has completed (after a round's transfer, all of
        that round's), so reading them never waits for the device. Reading takes them: the
        engine's `Timings` is the one reader, and every policy reads the timings."""
        done = []
        while self._shapes:
            rows, width, timing = self._shapes[0]
            if isinstance(timing, tuple):
                start, end = timing
                if not end.query():
                    break
                timing = start.elapsed_time(end) / 1000.0
            done.append((rows, width, float(timing)))
            self._shapes.popleft()
        return done

    @contextmanager
    def _timed(
        self, shape: tuple[int, int] | None = None, compiling: bool = False
    ) -> Iterator[None]:
        """Time the block: CUDA events on a GPU (read later, no sync), the wall clock on CPU;
        a forward's (rows, width) `shape` is kept with its time for `forward_times`.
        `compiling`: the block compiles a new shape; its wall time goes to `compile_seconds`
        alone (after a sync, as a warm-up is timed). A compiled runner's block that compiled
        a graph unforeseen (dynamo recompiled a known shape) is moved there too, with a
        warning: a recompile is never timed as a forward."""
        graphs = self._compile_work()
        if compiling:
            synchronize(self.device)
            began = time.perf_counter()
            yield
            self._add_compile(began, graphs)
            return
        start = torch.cuda.Event(enable_timing=True) if self.device.type == "cuda" else None
        if start is not None:
            start.record()
        began = time.perf_counter()
        yield
        if (self.compiled or self.captured) and self._compile_work() > graphs:
            if compiled_graphs() > graphs[0]:
                log.warning(
                    "%s recompiled a shape it had compiled (rows, width %s)", self.layout, shape
                )
            self._add_compile(began, graphs)
            return
        if start is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((start, end))
            if shape is not None:
                self._shapes.append((*shape, (start, end)))
        else:
            elapsed = time.perf_counter() - began
            self._cpu_seconds += elapsed
            if shape is not None:
                self._shapes.append((*shape, elapsed))

    def _compile_work(self) -> tuple[int, int]:
        """(graphs dynamo compiled in this process, CUDA graphs this runner captured): a block
        that raised either compiled or captured."""
        return (
            compiled_graphs() if self.compiled else 0,
            self._captured.captures if self._captured is not None else 0,
        )

    def _add_compile(self, began: float, graphs: tuple[int, int]) -> None:
        """Count the block since `began` (once the device is done) as compile time, and the
        graphs dynamo compiled in it (`graphs`: `_compile_work` before)."""
        synchronize(self.device)
        self.compile_seconds += time.perf_counter() - began
        self.compiles += compiled_graphs() - graphs[0]

    @torch.inference_mode()
    def prime(self, cache: RowCache, rows: list[list[int]]) -> None:
        """Fill an empty cache with each row's tokens, a few rows a forward (`prefill_groups`),
        then lay the groups' caches side by side (short rows end in empty slots).

        Rows are right-padded to their group's longest prompt with no attention mask: under
        the causal mask a prompt token sees only the tokens before it, never the padding
        after it, so padding changes no real position's arithmetic (only the matmul shapes),
        and the padded slots are marked empty."""
        if cache.slots:
            raise ValueError("prime fills an empty cache; this one holds tokens already")
        lengths = [len(tokens) for tokens in rows]
        with self._timed():
            groups = []
            for members in prefill_groups(lengths, self.padded_prefill, self.prefill_tokens):
                width = max(lengths[r] for r in members)
                padded = [rows[r] + [0] * (width - lengths[r]) for r in members]
                ids = torch.as_tensor(padded, dtype=torch.long, device=self.device)
                _, _, kv = body(self.model, ids, past_key_values=DynamicCache(), use_cache=True)
                groups.append((members, kv))
            cache.absorb(groups, lengths)

    @torch.inference_mode()
    def forward(
        self,
        cache: RowCache,
        ids: torch.Tensor,
        counts: torch.Tensor,
        keep: torch.Tensor,
        restricted: bool = False,
        warp: SamplingConfig | None = None,
        then: AfterWarp | None = None,
        transient: bool = False,
    ) -> RowOutput:
        """Append ids[r, :counts[r]] to row r; return the outputs at block offsets keep[r, k]
        (the offset of the token whose next-token distribution is wanted; clamped into the
        block, so a row's unused entries may point anywhere). `restricted`: logits over the
        head's own tokens where the model has a restricted head (`RowOutput.support`).
        `warp`: the sampling the caller will warp the logits with; a captured runner does it
        in its graph (`RowOutput.probs`), the others leave it to the caller. `then` (with
        `warp`): what the caller will do with the warped distributions (`after_warp`); a
        captured runner does it in its graph (`RowOutput.drawn`, `RowOutput.accepted`).
        `transient`: the caller is done with every output before this runner's next forward,
        so a captured runner hands back views of its graph's output buffers, not copies (at
        batch 64 a verify's logits and probabilities are ~100 MB a round)."""
        if self.lean is not None:
            return self._lean_forward(cache, ids, counts, keep, restricted)
        if isinstance(cache, StaticRowCache):
            return self._static_forward(cache, ids, counts, keep, restricted, warp, then, transient)
        width = ids.shape[1]
        positions, mask = cache.block(counts, width)
        with self._timed((ids.shape[0], width)):
            final, chosen, kv = body(
                self.model,
                ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache.kv,
                hidden_layer=self.hidden_layer,
                use_cache=True,
            )
            cache.append(kv, counts, width)
            picked, hidden = _pick(final, chosen, keep, width, self.hidden_layer == -1)
            # the reference layout: full-vocabulary logits even for a restricted head
            logits = head_logits(self.model, picked, self.vocab_size).float()
        self._watch(logits, positions, keep, counts)
        return RowOutput(logits, hidden, final=picked)

    def _body_step(
        self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, kv: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The body over one static-shape block (what `compiled` compiles)."""
        final, chosen, _ = body(
            self.model,
            ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=kv,
            hidden_layer=self.hidden_layer,
            use_cache=True,
        )
        return final, chosen

    def _static_forward(
        self,
        cache: StaticRowCache,
        ids: torch.Tensor,
        counts: torch.Tensor,
        keep: torch.Tensor,
        restricted: bool,
        warp: SamplingConfig | None = None,
        then: AfterWarp | None = None,
        transient: bool = False,
    ) -> RowOutput:
        """`forward` over a `StaticRowCache`: the block and the mask padded to the cache's row
        bucket and capacity, the body at that static shape, the inert rows' outputs dropped;
        `restricted`: see `_head`."""
        rows, width = ids.shape
        cache.reserve(width)
        key = (cache.bucket, width, cache.capacity)
        compiling = self.compiled and key not in self._shapes_seen
        self._shapes_seen.add(key)
        ids = cache.pad_rows(ids)
        if self.compiled and not ids.is_inference():
            # dynamo guards on a tensor's dispatch keys: an input made outside inference mode
            # (the engine's) against one made inside (the latency profile's) recompiled every
            # shape, its time hidden in the forwards'
            ids = ids.clone()
        probs = drawn = accepted = None
        with self._timed((rows, width), compiling):
            if self._captured is not None:
                logits, hidden, picked, *warped = self._replayed(
                    cache, ids, counts, keep, restricted, warp, then, transient
                )
                probs, drawn, accepted = (*warped, None, None, None)[:3]
            else:
                positions, mask = cache.block(counts, width)
                final, chosen = self._step(ids, positions, mask, cache.kv)
                final, chosen = final[:rows], chosen[:rows]
                picked, hidden = _pick(final, chosen, keep, width, self.hidden_layer == -1)
                logits, _ = self._head(picked, restricted)
            cache.append(cache.kv, counts, width)
        if self._captured is None:
            self._watch(logits, positions[:rows], keep, counts)
        support = self.support if restricted else None
        return RowOutput(logits, hidden, support, picked, probs, drawn, accepted)

    def _replayed(
        self,
        cache: StaticRowCache,
        ids: torch.Tensor,
        counts: torch.Tensor,
        keep: torch.Tensor,
        restricted: bool,
        warp: SamplingConfig | None,
        then: AfterWarp | None,
        transient: bool,
    ) -> tuple[torch.Tensor, ...]:
        """`_captured_forward` over the padded block, replayed from its captured graph: a
        replay overwrites its outputs, so the rows kept are copied out (the engine may hold a
        round's draft outputs until the verify), unless `transient` (see `forward`)."""
        assert self._captured is not None
        self._replays_since_read = True
        if warp is None:
            then = None
        extra = () if then is None else tuple(cache.pad_rows(t) for t in then.tensors)
        outputs = self._captured(
            ids,
            cache.pad_rows(keep),
            cache.pad_rows(counts),
            *extra,
            kv=cache.kv,
            restricted=restricted,
            warp=warp,
            then=None if then is None else type(then),
        )
        rows, copies = len(counts), {}
        if transient:
            return tuple(t[:rows] for t in outputs)
        for t in outputs:  # an output returned twice (hidden layer -1) copied once
            if id(t) not in copies:
                copies[id(t)] = t[:rows].clone()
        return tuple(copies[id(t)] for t in outputs)

    def _captured_forward(
        self,
        ids: torch.Tensor,
        keep: torch.Tensor,
        counts: torch.Tensor,
        *extra: torch.Tensor,
        kv: Any,
        restricted: bool,
        warp: SamplingConfig | None,
        then: type[AfterWarp] | None,
    ) -> tuple[torch.Tensor, ...]:
        """What a captured graph records, over the row bucket: the block's position ids and
        mask, recorded in the cache's slot map (`RowStaticCache.block`), the body, the
        outputs at the kept offsets, the head, the warped distributions when `warp` is given
        (about twenty host ops a warp; row by row, so the inert rows change nothing),
        `then`'s work over them on its tensors `extra` when given (`after_warp`: a draw,
        nine host ops, or a speculative check, about forty; inert rows check nothing) and the
        lowest broken position, folded into `_broken_in_graphs` (inert rows feed nothing, so
        they never count as broken)."""
        width = ids.shape[1]
        positions, mask = kv.block(counts, width)
        final, chosen = self._step(ids, positions, mask, kv)
        picked, hidden = _pick(final, chosen, keep, width, self.hidden_layer == -1)
        logits, _ = self._head(picked, restricted)
        warped: tuple[torch.Tensor, ...] = ()
        if warp is not None:
            probs = warp_probs(logits, warp)
            warped = (probs, *(() if then is None else then.apply(probs, *extra)))
        first = broken_first(logits, positions, keep, counts)
        broken = self._broken_in_graphs
        assert broken is not None
        torch.minimum(broken, first, out=broken)
        return logits, hidden, picked, *warped

    def _head(
        self, hidden: torch.Tensor, restricted: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """float32 logits on the shared vocabulary, or, `restricted` with a restricted head,
        over its K tokens only (`support`, ascending), without the full-vocabulary scatter
        (on an H100 the compiled static draft's step cost 0.94 ms with it)."""
        if not restricted or self.support is None:
            return head_logits(self.model, hidden, self.vocab_size).float(), None
        if self.lean is not None:
            logits = self.lean.head_logits(hidden)
        else:
            logits = torch.nn.functional.linear(hidden, self.model.get_output_embeddings().weight)
            if self._head_order is not None:
                logits = logits[..., self._head_order]
        return logits[..., : self._support_size].float(), self.support

    def _lean_forward(
        self,
        cache: RowCache,
        ids: torch.Tensor,
        counts: torch.Tensor,
        keep: torch.Tensor,
        restricted: bool,
    ) -> RowOutput:
        """`forward` through `LeanDraft`: the cache's own slot marks are the mask, and a
        one-token step (every drafting step but a round's first) skips the gathers."""
        lean = self.lean
        assert lean is not None
        width = ids.shape[1]
        positions = cache.lengths[:, None]
        if width > 1:
            positions = positions + torch.arange(width, device=self.device)
        with self._timed((ids.shape[0], width)):
            final, chosen = lean.forward(
                ids, positions, cache.position >= 0, cache.kv, self.hidden_layer
            )
            cache.append(cache.kv, counts, width)
            if width == 1 and keep.shape[1] == 1:  # keep is clamped to the only offset
                picked, hidden = final, chosen
            else:
                picked, hidden = _pick(final, chosen, keep, width, self.hidden_layer == -1)
            logits, support = self._head(picked, restricted)
        self._watch(logits, positions, keep, counts)
        return RowOutput(logits, hidden, support, picked)

    def _watch(
        self,
        logits: torch.Tensor,
        positions: torch.Tensor,
        keep: torch.Tensor,
        counts: torch.Tensor,
    ) -> None:
        """Fold the lowest fed position whose logits are broken into a device scalar (the
        offsets past a row's fed tokens are padding and not checked)."""
        if logits.numel() == 0:
            return
        self._fold_broken(broken_first(logits, positions, keep, counts))

    def _fold_broken(self, first: torch.Tensor) -> None:
        seen = self._nonfinite
        self._nonfinite = first if seen is None else torch.minimum(seen, first)

    def nonfinite_position(self) -> torch.Tensor:
        """() on the device: the lowest position whose next-token logits were broken since the
        last call, or NO_POSITION; resets. The engine sends it home in each round's one
        transfer."""
        found, self._nonfinite = self._nonfinite, None
        if self._broken_in_graphs is not None and self._replays_since_read:
            self._replays_since_read = False
            with torch.inference_mode():
                in_graphs = self._broken_in_graphs.clone()
                self._broken_in_graphs.fill_(NO_POSITION)
            found = in_graphs if found is None else torch.minimum(found, in_graphs)
        return self._none_broken if found is None else found

    @staticmethod
    def raise_nonfinite(roles: list[str], positions: list[int]) -> None:
        """Stop on the first role whose `nonfinite_position` came home as a position."""
        for role, position in zip(roles, positions, strict=True):
            if position < NO_POSITION:
                raise nonfinite_error(
                    role, f"at position {position} (the next-token distribution after it)"
                )


def broken_first(
    logits: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor, counts: torch.Tensor
) -> torch.Tensor:
    """() on the device: the lowest fed position whose logits are broken, or NO_POSITION (the
    offsets past a row's fed tokens are padding and not checked)."""
    fed = (keep >= 0) & (keep < counts[:, None])
    if positions.shape[1] == 1:  # a one-token block: every kept offset clamps to it
        at = positions
    else:
        at = positions.gather(1, keep.clamp(0, positions.shape[1] - 1))
    return torch.where(broken_rows(logits) & fed, at, NO_POSITION).amin()


def prefill_groups(lengths: list[int], padded: bool, budget: int) -> list[list[int]]:
    """The rows (indices into `lengths`, empty prompts left out) each prefill forward takes.

    By length (`padded` false, a CPU's default): rows of one length together, no padding. On
    ShareGPT's prompts a batch padded to its longest is several times the compute of the
    prompts themselves, and a CPU's prefill is compute-bound, so a row costs its own length.
    Padded (a GPU's default): an eager forward there is launch-bound (an H100 paid about 17 ms
    for the 135M target's at any length), so 64 prompts of distinct lengths cost 64 of them,
    more than their whole decode; instead the rows, longest first, fill forwards of at most
    `budget` padded tokens (one forward for 64 prompts of <= 1,024 tokens at the default)."""
    present = [r for r, n in enumerate(lengths) if n]
    if not padded:
        by_length: dict[int, list[int]] = {}
        for r in present:
            by_length.setdefault(lengths[r], []).append(r)
        return list(by_length.values())
    groups: list[list[int]] = []
    for r in sorted(present, key=lambda r: -lengths[r]):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
            groups[-1].append(r)
        else:
            groups.append([r])
    return groups


def _pick(
    final: torch.Tensor, chosen: torch.Tensor, keep: torch.Tensor, width: int, same: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The final and chosen hidden states of a block at offsets keep[r, k] (clamped into the
    block: a row's unused entries may point anywhere); `same`: the chosen states are the
    final ones (hidden layer -1), picked once and returned as both."""
    index = keep.clamp(0, width - 1)[..., None]
    picked = final.gather(1, index.expand(-1, -1, final.shape[-1]))
    if same:
        return picked, picked
    return picked, chosen.gather(1, index.expand(-1, -1, chosen.shape[-1]))


def compiled_over_lean(device: torch.device) -> bool:
    """Whether a compiled runner runs a lean-capable draft compiled in the static layout (the
    lean buffers grow per step, so the lean path cannot compile) rather than lean and eager:
    on a GPU (H100: 0.94 ms a compiled draft step against 4-7 ms lean), not on a CPU (2-core
    CPU, float32: the lean step 5.0 ms against 6.8 compiled)."""
    return device.type == "cuda"


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def compiled_step(step: Any, device: torch.device, cudagraphs: bool = True) -> Any:
    """`step` under `torch.compile(fullgraph=True)` with dynamo's automatic dynamic shapes:
    the first shape compiles static, and a dimension seen changing recompiles once as a
    symbolic one, so the bucketed shapes (rows x widths) share a few graphs (tiny models,
    target_only/sd/svip at 1, 4 and 8 rows: 6 graphs and 55 s of compile on the 2-core CPU,
    against 18 graphs and 114 s with `dynamic=False`, the same tokens). Dynamo's recompile
    limit is raised to cover them. On CUDA the graphs replay as CUDA graphs
    (`reduce-overhead`), which records one per concrete shape (milliseconds, no compile). On
    a CPU the linears call the eager path's prepacked oneDNN weights through one custom op
    (`models.packed.packed_linear`) at any row count; inductor's own packing (`freezing`)
    needs a static row dimension, which the symbolic graphs lack, so there the 2- and 4-token
    verifies fell back to sgemm's slow small-M path (135M target over 600 tokens, 2-core
    EPYC, float32, 1 row: frozen 61/95/97 ms for 1/2/4 tokens, the op 68/74/83; 4 rows:
    136/180/191 against 117/109/176; eager dynamic layout 80/100/115 and 114/161/186).
    `cudagraphs` false: no `reduce-overhead` on CUDA, for a caller that captures the graphs
    itself (`graphs.CapturedSteps`, the runner's default on a GPU)."""
    limit = 256  # row buckets x widths x capacities of a run stay far below this
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, limit)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, limit)
    if device.type == "cuda" and cudagraphs:
        return torch.compile(step, fullgraph=True, dynamic=None, mode="reduce-overhead")
    return torch.compile(step, fullgraph=True, dynamic=None)
