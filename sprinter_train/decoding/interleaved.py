"""The harvest's `interleaved` mix: `InterleavedRuns` makes the `interleaved` prefix mix as SPRINTER's decoder leaves it: runs of
draft tokens kept exactly as the draft drew them (x ~ q, never corrected), each followed by a
single target token (y ~ p at that prefix). SPRINTER keeps a draft on its verifier's word and
calls the target when the verifier says no; without a verifier, the run goes on after every
draft token with probability `accept` (alpha, the pair's measured acceptance), so its length
is geometric and independent of the tokens: the tokens inside a run follow q and the token
after it follows p, exactly.

A round, per row: one uniform u of the row's stream gives its run length N = floor(log u /
log alpha) (so P(N >= n) = alpha^n), cut at `max_run` and the row's budget; the draft draws N
tokens; one target forward over them gives p after the run, whose sample is kept (SD's
"accept all + bonus" with a random, token-independent number of drafts). A row whose run
reaches `max_run` commits its drafts without the target and draws a fresh N next round: the
geometric law is memoryless, so `max_run` bounds a round's width, never a run's length.

A round reports its run as drafted and accepted, so the engine's `GenerationResult.from_draft`
marks the run's tokens as kept drafts and the target's token as not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from sprinter_train.decoding.batch import Batch, Emitted, Round, Row
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import (
    Method,
    Traits,
    draft_round,
    verify,
)

HARVEST_TRAITS = Traits(  # a harvest generator, never a bench method
    lossless=False,
    greedy_exact=False,
    needs=frozenset(),
    law_computed=False,
    exports=False,
    rivals=(),
    record_score=None,
)


def run_lengths(u: torch.Tensor, accept: float, limit: torch.Tensor) -> torch.Tensor:
    """(B,) geometric run lengths by the inverse CDF, N = floor(log u / log accept), so
    P(N >= n) = accept^n, cut at `limit` (u = 0 gives +inf, hence the limit)."""
    n = torch.floor(torch.log(u) / math.log(accept))
    return torch.minimum(n, limit.to(n.dtype)).long()


@dataclass
class InterleavedRuns(Method):
    """Geometric draft runs kept as drawn, each ended by one target token (module docstring),
    in the rows listed in `drafting` (`Row.index`; None: every row). The other rows (the
    `target` mix sharing the call) draft nothing and draw their token from p with one draw
    of their stream, exactly as TargetOnly's round does, so sharing never changes them."""

    traits: ClassVar[Traits] = HARVEST_TRAITS

    accept: float
    max_run: int
    drafting: frozenset[int] | None = None
    name: str = "harvest_interleaved"

    def __post_init__(self) -> None:
        if not 0.0 < self.accept < 1.0:
            raise ValueError(f"the interleaved runs' accept must be in (0, 1), got {self.accept}")
        if self.max_run < 1:
            raise ValueError(f"the interleaved runs' max_run must be >= 1, got {self.max_run}")

    def drafts_in(self, row: Row) -> bool:
        return self.drafting is None or row.index in self.drafting

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        drafting = [self.drafts_in(row) for row in batch.rows]
        if not any(drafting):
            return verify(engine, batch, Round())
        limits = [
            min(self.max_run, row.remaining) if d else 0
            for row, d in zip(batch.rows, drafting, strict=True)
        ]
        # 1. each drafting row's run length, from one draw of its own stream
        drafts_here = engine.tensor(drafting).bool()
        limit = engine.tensor(limits)
        run = run_lengths(batch.streams.uniform(1, drafts_here)[:, 0], self.accept, limit)
        # 2. draft the runs; a target row is fed to the draft with the round's first call
        # (so the draft's cache keeps up and later calls stay narrow) but never draws
        feed = [n if d else 1 for n, d in zip(limits, drafting, strict=True)]
        rnd = draft_round(engine, batch, feed, keep=lambda j, _step: j < run)
        counts = rnd.counts
        assert counts is not None
        drafts = rnd.tokens()
        # 3. one target forward in the rows whose run ended: p after the run, sampled, kept.
        # It runs even if every row's run was cut (rare: alpha^max_run a row), since
        # `engine.any` answers for monotone drafting flags only (stale on CUDA)
        ends = ~(drafts_here & (counts == limit))
        p = engine.target_probs(batch, rnd, ends)
        at = counts[:, None, None].expand(-1, 1, p.shape[-1])
        token = engine.sample(p.gather(1, at)[:, 0], batch, ends)
        drafts = torch.cat([drafts, drafts[:, :1]], 1).scatter(1, counts[:, None], token[:, None])
        # drafts are committed unchecked: they count as kept without the target's check
        return Emitted(
            drafts, counts + ends.long(), counts, counts, torch.zeros_like(counts), counts
        )
