"""The oracle: each round, the better for the batch of a target-only step and drafting, per
row, exactly what the target keeps plus the one it rejects, priced by the run's own cost
model: a bound on what any lossless length policy can buy at this pair, cost and batch size.

Every round without queued tokens (below) looks ahead first, unbilled: the draft drafts up
to `max_gamma` tokens a row and the target checks them as sd's round at that gamma would,
under the rows' own random numbers, which says how many each row keeps (N) and the block it
emits (its kept drafts, then the correction or bonus token). The caches and streams are then
put back as they were. The engine's timings price both ways of emitting those blocks at
this batch size B: drafting, sum_r (N_r + 1) tokens over max_r d_r drafting steps and the
target's forward over max_r d_r + 1 tokens a row (d_r = min(N_r + 1, room_r)); a
target-only step, B tokens over the target's forward over one token a row.

Where drafting pays at least as much, the real round drafts d_r a row, the same tokens from the
same numbers, and has the target check them with the numbers sd's check used (its tests' and
its draw's, `oracle_uniforms`): every row emits the block sd at `max_gamma` emits, paying
only for the drafts up to the first rejection and a target forward over them.

Where it does not, the round is a target-only step in which every row emits its block's first
token and queues the rest (`row.memory`), and the rows' streams move past the numbers the
block used, as after sd's round. While any row holds queued tokens, every round is a
target-only step: a row with a queue emits its next queued token and takes no number, a row
without one emits the target's fresh draw from its next number. No drafting, no look-ahead.

Why the law is the target's. A row's tokens are the same blocks whichever way the batch
chose: only when they are delivered changes. Whether the row next starts an sd block (a
round without queues anywhere) or takes a fresh draw (others still deliver theirs) is fixed
by blocks already drawn (its own and its mates'), not by numbers the row has yet to use, and
every number a row uses is used once. So each row's stream is a concatenation of whole sd blocks and fresh
target draws at boundaries fixed by the past, each the target's law given its prefix: the
target's law, exactly where the forwards repeat bit for bit. (Emitting a fresh draw instead
of the block whenever drafting does not pay would not be: the choice reads the block's N,
and the blocks that pay are the ones that agree with the draft.) At batch 1 a row emits sd's
tokens at `max_gamma` whatever the prices; in a batch, the fresh draws make the tokens
differ from sd's, never the law. Without prices (timings with no priors) every round
drafts: the tokens are sd's.

The look-ahead's time, calls and model seconds are kept off the run's figures
(`DecodeStats.unbilled_*`), and so are reading its outcome and the choice it prices.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from sprinter_train.core.runtime import synchronize
from sprinter_train.decoding.batch import Batch, DraftStep, Emitted, Round
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies.base import (
    Method,
    Traits,
    draft_round,
    target_check,
    verify,
)
from sprinter_train.decoding.runner.after_warp import Check, Draw
from sprinter_train.decoding.timings import DRAFTING, Seconds, StepCost, Timings

LOOKAHEAD_ROLES = ("target", "draft")  # the models the look-ahead runs
QUEUE = "oracle_queue"  # row.memory: the tokens of the row's block it has yet to emit


def oracle_uniforms(
    u: torch.Tensor, room: torch.Tensor, kept: torch.Tensor, width: int
) -> torch.Tensor:
    """(B, width + 1) the numbers the real round's check reads, from u (B, n), the rows'
    numbers after their `kept` real drafts: sd's check at `room` drafts a row tests draft i
    with the number at room + i of the round and draws with the one at 2 room, so the check
    of `kept` drafts takes those (a row drafted nothing: its draw is the round's first)."""
    i = torch.arange(width + 1, device=u.device)[None, :]
    room, kept = room[:, None], kept[:, None]
    index = torch.where(i < kept, room - kept + i, 2 * room - kept)
    return u.gather(1, index.clamp(min=0, max=u.shape[1] - 1))


@dataclass
class OracleLength(Method):
    """Per round, the better of a target-only step and drafting, per row, exactly what the
    target keeps plus the draft it rejects (all `max_gamma` when it keeps them all), priced
    at the engine's timings for this batch size: a look-ahead the bench does not bill finds
    how many. When the target-only step wins, each row's block is delivered a token a round,
    so the rows emit the same blocks either way (the module says how, and why the law is the
    target's)."""

    # every trait spelt out (Traits has no defaults): the blocks look alike on purpose
    traits: ClassVar[Traits] = Traits(
        lossless=True,
        greedy_exact=True,
        needs=frozenset(),
        law_computed=False,
        exports=False,
        rivals=("sd",),
        record_score=None,
    )

    max_gamma: int
    name: str = "oracle"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        queues = [row.memory.get(QUEUE) or [] for row in batch.rows]
        if any(queues):
            return queued_round(engine, batch, queues)
        limits = batch.room(self.max_gamma)
        if max(limits, default=0) == 0:
            return verify(engine, batch, Round())
        costs = prices(engine.timings, len(batch))
        if costs is None:  # nothing to price with: draft, as sd at max_gamma would
            kept, _ = unbilled(engine, batch, lambda: look_ahead(engine, batch, limits))
            return drafting_round(engine, batch, limits, kept)

        def ahead() -> tuple[torch.Tensor, list[list[int]], bool]:
            kept, tokens = look_ahead(engine, batch, limits)
            read = torch.cat([kept[:, None], tokens], 1).tolist()  # priced on the host
            blocks = [values[1 : values[0] + 2] for values in read]
            return kept, blocks, drafting_pays(blocks, limits, len(batch), *costs)

        kept, blocks, pays = unbilled(engine, batch, ahead)  # the choice is the oracle's too
        if pays:
            return drafting_round(engine, batch, limits, kept)
        return block_round(engine, batch, limits, blocks)


def prices(timings: Timings, rows: int) -> tuple[Seconds, StepCost] | None:
    """The target's forward and one drafting step (the draft's alone) at the engine's
    timings; None where the timings have no priors to price with (asking them raises)."""
    try:
        timings.target(rows, 1)
        timings.step(rows, DRAFTING)
    except ValueError:
        return None
    return timings.target, timings.step_cost(DRAFTING)


def drafting_pays(
    blocks: list[list[int]], limits: list[int], rows: int, target: Seconds, step: StepCost
) -> bool:
    """Whether drafting each row's block in one round (its N drafts, d = min(N + 1, room)
    of them drafted, and a target forward over the longest d + 1) gives at least the tokens
    a second of a target-only step (a token a row over a forward of one token a row)."""
    longest = max(min(len(block), room) for block, room in zip(blocks, limits, strict=True))
    drafting = sum(map(len, blocks)) / (longest * step(rows) + target(rows, longest + 1))
    return drafting >= rows / target(rows, 1)


def drafting_round(engine: Engine, batch: Batch, limits: list[int], kept: torch.Tensor) -> Emitted:
    """The real round: min(kept + 1, room) drafts a row, the look-ahead's tokens, checked with
    the numbers sd's check at `limits` used; every row emits sd's block."""
    room = engine.tensor(limits)
    real = torch.minimum(kept + 1, room)  # the drafts the oracle pays for

    rnd = Round()

    def stop(step: DraftStep) -> torch.Tensor:
        return len(rnd.steps) >= real

    draft_round(engine, batch, limits, stop, rnd=rnd)
    drafts = rnd.tokens()
    width = 2 * max(limits) + 1  # sd's round at this room takes 2 room + 1 numbers a row
    u = oracle_uniforms(batch.streams.peek(width), room, rnd.counts, drafts.shape[1])
    accepted, tokens = target_check(engine, batch, rnd, Check(rnd.q(), drafts, rnd.counts, u))
    batch.streams.advance(width, 2 * room + 1 - rnd.counts)  # as sd's round would
    return Emitted(tokens, accepted + 1, accepted, rnd.counts, accepted)


def block_round(
    engine: Engine, batch: Batch, limits: list[int], blocks: list[list[int]]
) -> Emitted:
    """The target-only step that starts delivering the look-ahead's blocks: each row emits its
    block's first token and queues the rest (up to an EOS, which ends the row), and its
    stream moves past the 2 room + 1 numbers sd's round took."""
    eos = engine.eos_token_id
    for row, block in zip(batch.rows, blocks, strict=True):
        if eos is not None and eos in block:
            block = block[: block.index(eos) + 1]
        row.memory[QUEUE] = block[1:]
    first = engine.tensor([block[0] for block in blocks])
    everyone = torch.ones(len(batch), dtype=torch.bool, device=engine.device)
    emitted = target_round(engine, batch, first, everyone)
    width = 2 * max(limits) + 1
    batch.streams.advance(width, 2 * engine.tensor(limits) + 1)
    return emitted


def queued_round(engine: Engine, batch: Batch, queues: list[list[int]]) -> Emitted:
    """A target-only step while some row holds queued tokens: those emit their next one."""
    owned = engine.tensor([len(queue) > 0 for queue in queues]).bool()
    fixed = engine.tensor([queue.pop(0) if queue else 0 for queue in queues])
    return target_round(engine, batch, fixed, owned)


def target_round(engine: Engine, batch: Batch, fixed: torch.Tensor, owned: torch.Tensor) -> Emitted:
    """target_only's round (`verify` without drafts), but the `owned` rows emit `fixed`
    instead of a draw and take no number: the target's forward runs over every row (its
    cache catches up; the draft's does when it next drafts, `Engine.lacking`)."""
    draw = Draw(batch.streams.peek()[:, 0])
    everyone = torch.ones(len(batch), dtype=torch.bool, device=engine.device)
    p = engine.target_probs(batch, Round(), everyone, draw)
    token = engine.draw(p, batch.verified, batch, draw, ~owned)
    token = torch.where(owned, fixed, token)
    none = torch.zeros_like(token)
    return Emitted(token[:, None], none + 1, none, none, none)


def look_ahead(
    engine: Engine, batch: Batch, limits: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) how many of `limits[r]` drafts the target keeps in row r under sd's round (N),
    and (B, G + 1) the round's tokens (row r's block: its first N + 1), the rows left as they
    were: caches cut back to the committed tokens, streams rewound."""
    streams = copy.copy(batch.streams)  # advancing rebinds its tensors: the copy stays put
    rnd = draft_round(engine, batch, limits)
    drafts = rnd.tokens()
    check = Check(rnd.q(), drafts, rnd.counts, batch.streams.peek(drafts.shape[1] + 1))
    kept, tokens = target_check(engine, batch, rnd, check)
    kept, tokens = kept.clone(), tokens.clone()  # the target's outputs are transient
    batch.verified = None
    batch.streams = streams
    # the caches keep the committed tokens the look-ahead fed but the last, which the real
    # round's forwards feed again (a forward needs a token to predict from)
    held = [len(row.tokens) - 1 for row in batch.rows]
    for role in LOOKAHEAD_ROLES:
        batch.caches[role].truncate(engine.tensor(held), min(held))
        batch.held[role] = list(held)
    return kept, tokens


def unbilled(engine: Engine, batch: Batch, work):
    """`work()`'s result, its wall time, model seconds and calls kept off the run's figures
    (`DecodeStats.unbilled_*`, which `Engine.generate` takes off; the calls are undone)."""
    stats = batch.stats
    synchronize(engine.device)
    began = time.perf_counter()
    seconds = {role: engine.runner(role).seconds for role in LOOKAHEAD_ROLES}
    calls = {role: getattr(stats, f"{role}_calls") for role in LOOKAHEAD_ROLES}
    result = work()
    for role in LOOKAHEAD_ROLES:
        spent = engine.runner(role).seconds - seconds[role]  # synchronises on CUDA
        setattr(
            stats, f"unbilled_{role}_seconds", getattr(stats, f"unbilled_{role}_seconds") + spent
        )
        setattr(stats, f"{role}_calls", calls[role])
    synchronize(engine.device)
    stats.unbilled_seconds += time.perf_counter() - began
    return result
