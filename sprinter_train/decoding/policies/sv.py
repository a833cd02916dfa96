"""SV: a companion model's agreement with the draft, through a fitted table, prices each draft."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from sprinter_train.decoding.batch import Batch, DraftStep, Emitted, Round, Row
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies.base import (
    AcceptanceTable,
    GoodputMethod,
    Traits,
    draft_round,
    gamma_round,
    overlap,
    step_features,
    verify,
)
from sprinter_train.decoding.policies.plans.companion_plan import CompanionPlan
from sprinter_train.decoding.policies.plans.goodput import best_gamma
from sprinter_train.decoding.timings import Timings


def first_overlap(q: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """(1,) SV's S = sum_v min(q, c) of one row's first draft, from its (V,) laws."""
    return torch.minimum(q, c).sum(-1, keepdim=True)


@dataclass
class SpecVerification(GoodputMethod):
    """SV §5 with its batch scheduler, exact.

    Before row r draws its next draft, the table gives that token's acceptance from S alone
    (P(accept | S), fixed before the draw); its gain in expected accepted tokens is that times
    the product of the row's refined acceptances so far, P(accept | S, A) of its drawn drafts.
    Rows draw in order of gain while the batch's estimated goodput, (expected accepted + one
    target token per row) / (drafting time + the target forward at this batch size and width,
    at the engine's timings), rises; a row that does not draw stops for the round. Every
    drawn token is verified with speculative sampling, so A_j only shapes the decision about
    x_{j+1}.
    Which rows draft depends on their batch-mates (they share the verification's width), so
    in sampling mode a row's tokens depend on them too; its law does not. Before any forward,
    a round whose average token (the table's prior) would not pay for one drafting step is
    not drafted at all: otherwise a batch where drafting never pays would still spend a draft
    and a companion forward a round to find out. Likewise after each draw, a row whose next
    draft would not pay at its last draft's refined acceptance stops before that draft's
    forwards.
    """

    # every trait spelt out (Traits has no defaults): the blocks look alike on purpose
    traits: ClassVar[Traits] = Traits(
        lossless=True,
        greedy_exact=True,
        needs=frozenset({"table", "companion", "latency"}),
        law_computed=True,
        exports=True,
        rivals=("target_only", "sd"),
        record_score=None,
    )

    table: AcceptanceTable
    max_gamma: int
    name: str = "sv"
    # None: every round reads the companion (SV as published); a plan lets rounds skip it, or
    # drafting altogether, where the run measured that they do not pay
    companion_plan: CompanionPlan | None = None

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        B = len(batch)
        rnd = Round()
        timings = engine.timings
        plan = self.companion_plan
        mode = "companion" if plan is None else plan.begin(batch, timings.target(B, 1))
        if mode == "target":
            return verify(engine, batch, rnd)
        if mode == "prior":
            return self.prior_round(engine, batch, plan.acceptance.value)  # type: ignore[union-attr]
        if not self.worth_a_draft(timings, B):
            return verify(engine, batch, rnd)
        product = torch.ones(B, dtype=torch.float64, device=engine.device)
        expected = torch.zeros(B, dtype=torch.float64, device=engine.device)
        companion: list[torch.Tensor] = []

        def keep(j: int, step: DraftStep) -> torch.Tensor:
            companion.append(engine.companion_probs(batch, rnd, step.active))
            before = self.table.lookup_s(overlap(step, companion[-1]))
            gain = torch.where(step.active, product * before.double(), 0.0)
            return self.schedule(timings, B, j, expected, gain)

        def stop(step: DraftStep) -> torch.Tensor:
            nonlocal product, expected
            S, A = step_features(step, companion[-1])
            refined = self.table.lookup(S, A).double()
            product = torch.where(step.active, product * refined, product)
            expected = torch.where(step.active, expected + product, expected)
            # whether a row looks at draft j + 1 at all (a draft and a companion forward) is
            # decided from what x_j told, which may shape only the drafting after x_j: x_j's
            # refined acceptance stands in for the next draft's, so a round does not end on
            # a drafting step spent to learn that no draft pays
            foreseen = torch.where(step.active, product * refined, 0.0)
            return ~self.schedule(timings, B, len(rnd.steps), expected, foreseen)

        draft_round(engine, batch, batch.room(self.max_gamma), stop, keep, rnd)
        return verify(engine, batch, rnd)

    def prior_round(self, engine: Engine, batch: Batch, alpha: float | None) -> Emitted:
        """A round without the companion: every row drafts the gamma of highest estimated
        goodput at acceptance `alpha` (else the table's prior), each step priced at the
        draft's forward alone; gamma 0 is a target-only round."""
        alpha = float(self.table.prior) if alpha is None else alpha
        timings = engine.timings
        gamma = best_gamma(alpha, len(batch), self.max_gamma, timings.target, timings.step_cost())
        return gamma_round(engine, batch, gamma)

    def first_draft_keeps(
        self, engine: Engine, prompt: list[int], q: torch.Tensor, c: torch.Tensor | None
    ) -> torch.Tensor:
        """`round` at j = 0, B = 1: whether to draw is decided from P(accept | S) before the
        draw, so it is one decision for every x."""
        V = q.shape[-1]
        never = torch.zeros(V, dtype=torch.bool, device=q.device)
        if self.max_gamma < 1 or c is None or not self.worth_a_draft(engine.timings, 1):
            return never
        gain = self.table.lookup_s(first_overlap(q, c)).double()
        expected = torch.zeros(1, dtype=torch.float64, device=q.device)
        return self.schedule(engine.timings, 1, 0, expected, gain).expand(V)

    @property
    def prior(self) -> float:
        """The table's P(accept) over all records."""
        return float(self.table.prior)

    def update(self, row: Row, drafted: int, accepted: int) -> None:
        if self.companion_plan is not None:
            self.companion_plan.observe(drafted, accepted)

    def schedule(
        self, timings: Timings, B: int, j: int, expected: torch.Tensor, gain: torch.Tensor
    ) -> torch.Tensor:
        """Which rows draw draft j: the m rows of highest gain, m maximising the estimated
        goodput (m = 0 ends the round for every row). Computed on the device."""
        latency, step_cost = self.costs(timings)
        order = gain.argsort(descending=True)
        cumulative = gain[order].cumsum(0)
        base = expected.sum() + B
        stop_time = j * step_cost(B) + latency(B, j + 1)
        go_time = (j + 1) * step_cost(B) + latency(B, j + 2)
        goodput = torch.cat([(base / stop_time)[None], (base + cumulative) / go_time])
        m = goodput.argmax()
        rank = torch.empty_like(order)
        rank[order] = torch.arange(B, device=gain.device)
        return (rank < m) & (gain > 0)


@dataclass
class SpecVerificationPaper(GoodputMethod):
    """SV §5's rule as published, per row: draw x_j, look up P(accept | S_j, A_j) with A_j
    from x_j itself, and drop x_j (stop) when it would lower the row's goodput. Lossy: whether
    x_j is verified depends on x_j's value, so a verified x_j is no longer distributed as q_j
    (p = q = (1/2, 1/2) with c = (1, 0) emits token 0 with probability 3/4). Kept to measure
    how far the published rule is from the target law."""

    # every trait spelt out (Traits has no defaults): the blocks look alike on purpose
    traits: ClassVar[Traits] = Traits(
        lossless=False,
        greedy_exact=True,
        needs=frozenset({"table", "companion", "latency"}),
        law_computed=True,
        exports=False,
        rivals=(),
        record_score=None,
    )

    table: AcceptanceTable
    max_gamma: int
    name: str = "sv_paper"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        latency, step_cost = self.costs(engine.timings)
        B = len(batch)
        rnd = Round()
        device = engine.device
        room = batch.room(self.max_gamma)
        limit = engine.tensor(room)
        counts = torch.zeros(B, dtype=torch.long, device=device)
        active = limit > 0
        product = torch.ones(B, dtype=torch.float64, device=device)
        expected = torch.zeros(B, dtype=torch.float64, device=device)
        for j in range(max(room, default=0)):
            if j > 0 and not engine.any(active):
                break
            step = engine.draft_step(batch, rnd, active)
            c = engine.companion_probs(batch, rnd, active)
            rnd.steps.append(step)
            S, A = step_features(step, c)
            grown = product * self.table.lookup(S, A).double()
            before = (expected + 1) / (j * step_cost(B) + latency(B, j + 1))
            after = (expected + grown + 1) / ((j + 1) * step_cost(B) + latency(B, j + 2))
            kept = active & (after >= before)
            counts = counts + kept.long()
            product = torch.where(kept, grown, product)
            expected = torch.where(kept, expected + grown, expected)
            active = kept & (counts < limit)
        rnd.counts = counts
        return verify(engine, batch, rnd)

    def first_draft_keeps(
        self, engine: Engine, prompt: list[int], q: torch.Tensor, c: torch.Tensor | None
    ) -> torch.Tensor:
        """`round` at j = 0, B = 1 for every x at once: x is kept when its own A(x) (as
        `companion_features` computes it for the drawn token) raises the goodput."""
        V = q.shape[-1]
        if self.max_gamma < 1 or c is None:
            return torch.zeros(V, dtype=torch.bool, device=q.device)
        A = torch.where(q > 0, (c / q.clamp(min=1e-30)).clamp(max=1.0), 0.0)
        grown = self.table.lookup(first_overlap(q, c).expand(V), A).double()
        latency, step_cost = self.costs(engine.timings)
        before = 1.0 / latency(1, 1)
        after = (grown + 1) / (step_cost(1) + latency(1, 2))
        return after >= before
