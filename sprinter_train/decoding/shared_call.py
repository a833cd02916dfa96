"""One engine call for a few `target` and `interleaved` rows: their target forwards are shared.

With a few rows, a CPU target forward costs about the same for a block of several tokens as
for one (it streams the weights either way), so the target mix's 32 sequential forwards can
verify the interleaved rows' drafts too instead of the interleaved rows paying for their own.
With many rows the forward is compute-bound and the target rows' padding to the drafts' width
costs more than it saves, so the harvest shares a call only up to
`harvest.shared_generation_rows` rows (harvest.continuations.build_sequences).

Each row keeps its own mix's round exactly: a target row drafts nothing and draws its token
from p with one draw of its stream (TargetOnly's round); an interleaved row drafts up to gamma
tokens and is verified as SpeculativeDecoding(gamma) verifies it. So a row's draws and law do
not depend on whether it shared a call.
"""

from __future__ import annotations

from dataclasses import dataclass

from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import Method, draft_round, verify
from sprinter_train.decoding.state import Batch, Emitted, Round, Row


@dataclass(frozen=True)
class SharedTargetRounds(Method):
    """SpeculativeDecoding(gamma) in the rows listed in `drafting` (`Row.index`), TargetOnly
    in the others."""

    gamma: int
    drafting: frozenset[int]
    name: str = "harvest_shared"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        room = batch.room(self.gamma)
        drafts = [
            n if row.index in self.drafting else 0 for n, row in zip(room, batch.rows, strict=True)
        ]
        if max(drafts, default=0) == 0:
            return verify(engine, batch, Round())
        # a target row is fed to the draft with the round's first draft call, so the draft's
        # cache keeps up with it and later calls stay narrow, but it never draws a draft
        limits = [
            d if row.index in self.drafting else min(n, 1)
            for d, n, row in zip(drafts, room, batch.rows, strict=True)
        ]
        drafting = engine.tensor([row.index in self.drafting for row in batch.rows]).bool()
        return verify(
            engine, batch, draft_round(engine, batch, limits, keep=lambda _j, _step: drafting)
        )

    def update(self, row: Row, drafted: int, accepted: int) -> None:
        """Nothing to remember between rounds (gamma is fixed)."""
