"""sd_learned: speculative sampling whose length a trained predictor chooses, lossless."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from sprinter_train.decoding.batch import Batch, DraftStep, Emitted, Round, Row
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.features.table import pre_draw_features
from sprinter_train.decoding.policies.base import (
    AcceptanceTable,
    GoodputMethod,
    Traits,
    Verifier,
    draft_round,
    overlap,
    step_features,
    step_score,
    verify,
)
from sprinter_train.decoding.policies.plans.stop_rules import RoundStops, StopRule, StopRules
from sprinter_train.decoding.timings import Timings


def scores_before_the_draw(verifier: object) -> bool:
    """Whether a verifier's score of x_j is fixed before x_j is drawn: every feature it reads
    is (feature_table.pre_draw_features(): the draft hidden state that produced q_j, H(q_j)).
    A verifier that names no features, or reads any of x_j's own (its embedding, q(x_j)),
    counts as scoring after the draw."""
    declared = getattr(verifier, "pre_draw", None)  # a scorer that says (the online logistic)
    if declared is not None:
        return bool(declared)
    names = getattr(getattr(verifier, "spec", None), "names", None)
    return bool(names) and set(names) <= pre_draw_features()


@dataclass
class LearnedLength(GoodputMethod):
    """sd_learned: speculative sampling whose drafting length a trained predictor chooses, per
    row, lossless.

    Each draft's acceptance is estimated by the verifier (calibrated P(accept)) and, with a
    table, SV's P(accept | S) before the draw and P(accept | S, A) after it (their mean). A row
    draws its next draft while that raises its estimated goodput, (E(N | gamma) + 1) /
    (gamma drafting steps + the target forward over gamma + 1 tokens at this batch size, at
    the engine's timings); every drawn draft is verified. Exact by the module's rule: a
    verifier that reads only features fixed before x_j is drawn (`hidden`, `draft_entropy`)
    decides whether x_j is drawn; one that reads x_j's own (`token_embedding`, `q`) only
    refines the product of acceptances that later drafts are weighed by (without a table a
    row's first draft is then always drawn). After each draw, x_j's acceptance stands in for the next draft's: a row
    whose next draft would not pay at it stops before that draft's forward, so a round does
    not end on a drafting step spent to learn that no draft pays (as sv does). The batch size
    enters the latency, so in sampling mode a row's tokens depend on how many rows it decodes
    beside; its law does not. A round whose average draft (the predictors' prior) would not
    pay for one drafting step is not drafted at all.
    """

    # every trait spelt out (Traits has no defaults): the blocks look alike on purpose
    traits: ClassVar[Traits] = Traits(
        lossless=True,
        greedy_exact=True,
        needs=frozenset({"verifier", "table", "latency"}),
        law_computed=True,
        exports=True,
        rivals=("sd", "svip", "sd_heuristic"),
        record_score=None,
    )

    verifier: Verifier  # its `spec.names` say which features it reads (CheckpointVerifier's)
    table: AcceptanceTable | None
    max_gamma: int
    # when a row stops, by batch size (plans/stop_rules.py): "auto" (the bench chooses one a
    # batch size on the val records; elsewhere the goodput rule), one rule for every batch
    # size ({rule, threshold}), or the bench's choice (StopRules); None: goodput
    stop_rule: StopRules | Mapping[str, Any] | str | None = None
    name: str = "sd_learned"

    def __post_init__(self) -> None:
        given = self.stop_rule
        if given is None or given == "auto" or isinstance(given, StopRules):
            self.stop_rule = None if given == "auto" else given
        elif isinstance(given, Mapping):
            self.stop_rule = StopRules({1: StopRule(str(given["rule"]), given.get("threshold"))})
        else:
            raise ValueError(
                f"sd_learned's stop_rule is auto or {{rule: goodput|product|hazard|none, "
                f"threshold: ...}}, not {given!r}"
            )

    @property
    def drafting(self) -> tuple[str, ...]:
        """The draft's step, and the companion's where the table reads it."""
        return ("draft",) if self.table is None else ("draft", "companion")

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        B = len(batch)
        rnd = Round()
        stops = self.round_stops(engine.timings, B)  # each row's product and expectation
        if stops is None:
            return verify(engine, batch, rnd)
        before_draw = scores_before_the_draw(self.verifier)
        # a linear verifier scores each draft with its draw, in the draft's graph where it
        # has one (verifier/fused.py); a table or a pre-draw rule reads scores before draws
        scorer = getattr(self.verifier, "fused", None)
        in_step = scorer is not None and not before_draw and self.table is None
        companion: list[torch.Tensor] = []
        scored: list[torch.Tensor] = []  # the verifier's pre-draw score of the current draft

        def score(step: DraftStep) -> torch.Tensor:
            batch.stats.verifier_calls += 1
            return self.verifier(engine, batch, rnd, step).double()

        def keep(j: int, step: DraftStep) -> torch.Tensor:
            estimates = []
            if self.table is not None:
                companion.append(engine.companion_probs(batch, rnd, step.active))
                S = overlap(step, companion[-1])
                estimates.append(self.table.lookup_s(S).double())
            if before_draw:
                scored[:] = [score(step)]
                estimates.append(scored[0])
            return stops.rises(j, stops.product * torch.stack(estimates).mean(0))

        def stop(step: DraftStep) -> torch.Tensor:
            if in_step:
                batch.stats.verifier_calls += 1
                acceptance = step_score(self.verifier, step)
            else:
                estimates = [scored[0] if before_draw else score(step)]
                if self.table is not None:
                    S, A = step_features(step, companion[-1])
                    estimates.append(self.table.lookup(S, A).double())
                acceptance = estimates[0] if len(estimates) == 1 else torch.stack(estimates).mean(0)
            return stops.after(acceptance)

        informed = before_draw or self.table is not None  # a score known before the draw
        room = batch.room(self.max_gamma)
        draft_round(
            engine, batch, room, stop, keep if informed else None, rnd, scorer if in_step else None
        )
        return verify(engine, batch, rnd)

    def round_stops(self, timings: Timings, rows: int) -> RoundStops | None:
        """A round's stop rule at `rows` rows priced at `timings` (the engine's; vLLM's
        proposer passes the export's profile), or None where the round drafts nothing: its
        rule at this batch size is `none`, or with the goodput rule no draft at the prior
        pays."""
        latency, step_cost = self.costs(timings)
        rules = self.stop_rule
        rule = rules.at(rows, latency, step_cost) if isinstance(rules, StopRules) else StopRule()
        if rule.rule == "none":
            return None
        if rule.rule == "goodput" and not self.worth_a_draft(timings, rows):
            return None
        return RoundStops(rule, rows, latency, step_cost)

    def update(self, row: Row, drafted: int, accepted: int) -> None:
        """A verifier that learns while decoding (the online logistic) sees the outcome."""
        observe = getattr(self.verifier, "observe", None)
        if observe is not None:
            observe(row, drafted, accepted)

    def first_draft_keeps(
        self, engine: Engine, prompt: list[int], q: torch.Tensor, c: torch.Tensor | None
    ) -> torch.Tensor:
        """Whether to draw is taken from one real round on the prompt (its verifier, table
        and the timings learned so far), committed so the engine is left as a round leaves
        it: a score of x itself only decides about x_{j+1}, so it is one decision for all x."""
        batch = engine.new_batch([prompt], 2, [0])
        engine.commit(batch, self.round(engine, batch))
        return torch.full_like(q, batch.stats.drafted > 0, dtype=torch.bool)

    @property
    def prior(self) -> float:
        """A draft's average acceptance before any forward: the table's and the verifier's
        `prior` where they have one, else 1 (skip drafting only where even a sure draft would
        not pay)."""
        priors = [] if self.table is None else [float(self.table.prior)]
        if getattr(self.verifier, "prior", None) is not None:
            priors.append(float(self.verifier.prior))  # type: ignore[attr-defined]
        return sum(priors) / len(priors) if priors else 1.0
