"""The oracle length: each row drafts exactly as many tokens as the target will accept, plus
the one it rejects, the bound on what any length predictor can buy at a pair and cost.

Every round looks ahead first, unbilled: the draft drafts up to `max_gamma` tokens a row
and the target checks them as sd's round at that gamma would, under the rows' own random
numbers, which says how many each row keeps (N). The caches and streams are then put back
as they were and the real round drafts min(N + 1, room) a row, the same tokens from the
same numbers, and has the target check them with the numbers sd's check used (its tests'
and its draw's, `oracle_uniforms`): every row emits the tokens sd at `max_gamma` emits, so
the oracle keeps the target's law exactly where the forwards repeat bit for bit, and pays
only for the drafts up to the first rejection and a target forward over them. The
look-ahead's time, calls and model seconds are kept off the run's figures
(`DecodeStats.unbilled_*`).
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
from sprinter_train.decoding.policies.base import Method, Traits, draft_round, verify
from sprinter_train.decoding.runner.after_warp import Check

LOOKAHEAD_ROLES = ("target", "draft")  # the models the look-ahead runs


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
    """Drafts, per row and round, exactly what the target keeps plus the draft it rejects
    (all `max_gamma` when it keeps them all): a look-ahead the bench does not bill finds how
    many (the module says how, and why the law is the target's)."""

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
        limits = batch.room(self.max_gamma)
        if max(limits, default=0) == 0:
            return verify(engine, batch, Round())
        room = engine.tensor(limits)
        kept = unbilled(engine, batch, lambda: look_ahead(engine, batch, limits))
        real = torch.minimum(kept + 1, room)  # the drafts the oracle pays for

        rnd = Round()

        def stop(step: DraftStep) -> torch.Tensor:
            return len(rnd.steps) >= real

        draft_round(engine, batch, limits, stop, rnd=rnd)
        drafts = rnd.tokens()
        width = 2 * max(limits) + 1  # sd's round at this room takes 2 room + 1 numbers a row
        u = oracle_uniforms(batch.streams.peek(width), room, rnd.counts, drafts.shape[1])
        check = Check(rnd.q(), drafts, rnd.counts, u)
        everyone = torch.ones(len(batch), dtype=torch.bool, device=engine.device)
        p = engine.target_probs(batch, rnd, everyone, check)
        out = batch.verified
        if out.accepted is None:
            _, accepted, tokens = check.apply(p, *check.tensors)
        else:
            accepted, tokens = out.accepted, out.emitted
        batch.streams.advance(width, 2 * room + 1 - rnd.counts)  # as sd's round would
        return Emitted(tokens, accepted + 1, accepted, rnd.counts, accepted)


def look_ahead(engine: Engine, batch: Batch, limits: list[int]) -> torch.Tensor:
    """(B,) how many of `limits[r]` drafts the target keeps in row r under sd's round, the
    rows left as they were: caches cut back to the committed tokens, streams rewound."""
    streams = copy.copy(batch.streams)  # advancing rebinds its tensors: the copy stays put
    rnd = draft_round(engine, batch, limits)
    drafts = rnd.tokens()
    check = Check(rnd.q(), drafts, rnd.counts, batch.streams.peek(drafts.shape[1] + 1))
    everyone = torch.ones(len(batch), dtype=torch.bool, device=engine.device)
    p = engine.target_probs(batch, rnd, everyone, check)
    out = batch.verified
    kept = check.apply(p, *check.tensors)[1] if out.accepted is None else out.accepted
    kept = kept.clone()  # the target's outputs are transient
    batch.verified = None
    batch.streams = streams
    # the caches keep the committed tokens the look-ahead fed but the last, which the real
    # round's forwards feed again (a forward needs a token to predict from)
    held = [len(row.tokens) - 1 for row in batch.rows]
    for role in LOOKAHEAD_ROLES:
        batch.caches[role].truncate(engine.tensor(held), min(held))
        batch.held[role] = list(held)
    return kept


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
