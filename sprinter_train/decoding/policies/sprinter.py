"""SPRINTER: a trained verifier lets drafts through without the target (lossy by design)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from sprinter_train.core.rules import sprinter_check_rows
from sprinter_train.decoding.batch import Batch, DraftStep, Emitted, Round, Row
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies.base import Method, Traits, Verifier, draft_round, step_score


@dataclass
class Sprinter(Method):
    """SPRINTER Alg. 2 per row: draft while the verifier's score >= tau; the target runs once
    a round, on the rows whose verifier rejected a token, and checks that token only (keep it
    with min(1, p/q), else draw from norm(max(0, p - q))). No bonus token: Alg. 2 returns one
    token per target call, which keeps every position's law (1 - eta_FP) p + eta_FP q.
    A row whose run the verifier accepts up to `max_run` (or its budget) commits it without the
    target; the target's cache catches up at its next call. Tokens kept on the verifier's word
    count as `verifier_accepted`, only the target's check counts as `accepted`.
    """

    # every trait spelt out (Traits has no defaults): the blocks look alike on purpose
    traits: ClassVar[Traits] = Traits(
        lossless=False,
        greedy_exact=False,
        needs=frozenset({"verifier"}),
        law_computed=False,
        exports=True,
        rivals=("sd",),
        record_score=None,
    )

    verifier: Verifier
    tau: float
    max_run: int
    name: str = "sprinter"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        limits = [max(1, min(self.max_run, row.remaining)) for row in batch.rows]
        rejected: torch.Tensor | None = None  # each row's last draft, said no to
        rnd = Round()
        # a linear verifier scores each draft with its draw, in the draft's graph where it
        # has one (verifier/fused.py)
        scorer = getattr(self.verifier, "fused", None)

        def stop(step: DraftStep) -> torch.Tensor:
            nonlocal rejected
            score = (
                self.verifier(engine, batch, rnd, step)
                if scorer is None
                else step_score(self.verifier, step)
            )
            batch.stats.verifier_calls += 1
            said_no = score < self.tau
            # a row's last drafted token is checked where the verifier said no to it (a row
            # drafts at the first step: its limit is at least 1)
            first = rejected is None
            rejected = (
                said_no & step.active if first else torch.where(step.active, said_no, rejected)
            )
            return said_no

        draft_round(engine, batch, limits, stop, rnd=rnd, scorer=scorer)
        drafts, counts = rnd.tokens(), rnd.counts
        assert rejected is not None  # every round drafts at least one token a row
        checked = rejected.long()
        # exact, a host read (one a round): `engine.any` may answer on CUDA with the round's
        # last drafting flags, and a stale False here would drop a rejected token unchecked
        if not bool(rejected.any()):
            accepted = torch.zeros_like(counts)
        else:
            p = engine.target_probs(batch, rnd, rejected)
            last = (counts - 1).clamp(min=0)
            at = last[:, None, None].expand(-1, 1, p.shape[-1])
            p_x, q_x = p.gather(1, at)[:, 0], rnd.q().gather(1, at)[:, 0]
            x = drafts.gather(1, last[:, None])[:, 0]
            u = batch.streams.uniform(1, checked)[:, 0]
            u_fresh = batch.streams.uniform(1, checked)[:, 0]
            passed, token = sprinter_check_rows(p_x, q_x, x, u, u_fresh)
            drafts = drafts.scatter(1, last[:, None], torch.where(rejected, token, x)[:, None])
            accepted = (rejected & passed).long()
        kept = counts - checked
        return Emitted(drafts, counts, kept, counts, accepted, kept)

    def update(self, row: Row, drafted: int, accepted: int) -> None:
        """A verifier that learns while decoding sees the one outcome the target gave: the
        row's last draft, checked where its score fell below tau."""
        observe = getattr(self.verifier, "observe", None)
        if observe is not None and drafted > 0:
            observe(row, drafted, accepted, tau=self.tau)
