"""The target alone and speculative decoding with a fixed, planned or scheduled length."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from sprinter_train.core.rules import heuristic_next_gamma
from sprinter_train.decoding.batch import Batch, Emitted, Round, Row
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies.base import Method, Traits, fixed_round, gamma_round, verify


@dataclass
class TargetOnly(Method):
    # every trait spelt out (Traits has no defaults): the blocks look alike on purpose
    traits: ClassVar[Traits] = Traits(
        lossless=True,
        greedy_exact=True,
        needs=frozenset(),
        law_computed=False,
        exports=False,
        rivals=(),
        record_score=None,
    )

    name: str = "target_only"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        return verify(engine, batch, Round())


class GammaPlan(Protocol):
    """Chooses the drafts a row of sd's next round (decoding/policies/plans/gamma_plan.py's GammaPlanner)."""

    def plan(self, engine: Engine, rows: int, start: int) -> int:
        """From earlier rounds only (what is fixed before the round's first draft)."""
        ...

    def observe(self, drafted: int, accepted: int) -> None: ...


@dataclass
class SpeculativeDecoding(Method):
    """Leviathan et al. with gamma drafts a row per round: fixed, or with a `planner`
    (`gamma: auto` in the bench) chosen before each round from the run's own measurements,
    `gamma` then being where the planner starts. A round of gamma 0 is target_only's round:
    no draft forward."""

    # every trait spelt out (Traits has no defaults): the blocks look alike on purpose
    traits: ClassVar[Traits] = Traits(
        lossless=True,
        greedy_exact=True,
        needs=frozenset({"latency"}),
        law_computed=False,
        exports=False,
        rivals=("target_only",),
        record_score=None,
    )

    gamma: int
    name: str = "sd"
    planner: GammaPlan | None = None

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        gamma = self.gamma
        if self.planner is not None:
            gamma = self.planner.plan(engine, len(batch), self.gamma)
        return gamma_round(engine, batch, gamma)

    def update(self, row: Row, drafted: int, accepted: int) -> None:
        if self.planner is not None:
            self.planner.observe(drafted, accepted)


@dataclass
class HeuristicSD(Method):
    """Hugging Face's schedule, per row: gamma grows by 2 after a fully accepted round, else
    shrinks by 1."""

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

    gamma_init: int
    gamma_min: int = 1
    name: str = "sd_heuristic"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        limits = [
            max(0, min(row.memory.setdefault("gamma", self.gamma_init), row.remaining - 1))
            for row in batch.rows
        ]
        return verify(engine, batch, fixed_round(engine, batch, limits))

    def update(self, row: Row, drafted: int, accepted: int) -> None:
        if drafted:
            row.memory["gamma"] = heuristic_next_gamma(
                row.memory["gamma"], accepted, drafted, self.gamma_min
            )
