"""What every method shares: its declared traits, the base class the engine calls, the
drafting round and speculative verification, and the goodput pricing of the length planners.

Exactness rule for every length policy: a drafted token is always verified. The decision to
draft token j may use anything fixed before it is drawn (the prefix, q_j, the companion's
c_j and S_j) and the values of the tokens before it; a score computed from x_j's own value
(A_j, features of x_j) may only decide whether to draft x_{j+1}. Then each position is
speculative sampling with a stopping time, and the target's law is kept. A method that breaks
the rule on purpose says so in its traits (`lossless=False`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import torch

from sprinter_train.decoding.batch import Batch, DraftStep, Emitted, Round, Row
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies.plans.goodput import round_goodput
from sprinter_train.decoding.runner.after_warp import Check, Draw, StepScorer
from sprinter_train.decoding.runner.requests import RoundRequest
from sprinter_train.decoding.timings import Seconds, StepCost, Timings

Rule = Callable[[DraftStep], torch.Tensor]  # (B,) bool per row
# what a bench can give a method: artifacts its config names, the companion model, and
# "latency", the engine's timings primed with the bench's latency profile
NEEDS = frozenset({"verifier", "table", "companion", "latency"})


@dataclass(frozen=True)
class RecordScore:
    """A method's stopping rule as a P(accept) score of harvested records, so stage=evaluate
    ranks the rule the bench runs on the same rows as the trained predictors."""

    name: str  # the report's key
    columns: tuple[str, ...]  # the record columns `score` reads
    score: Callable[[Mapping[str, np.ndarray], Mapping[str, Any]], np.ndarray]  # (columns,
    # the method's settings) -> one score per row
    describe: Callable[[Mapping[str, Any]], str]  # settings -> one line for the report
    optional: tuple[str, ...] = ()  # columns `score` reads where the records have them
    # splits whose records the rule sees before the scored rows, flagged by a boolean `warm`
    # column (an online rule learns from them as a decoder learns from earlier traffic)
    warm_splits: tuple[str, ...] = ()


@dataclass(frozen=True)
class Traits:
    """What the rest of the system knows of a method, declared once beside its policy: the
    bench, evaluate, export, the report and the tests read these, never lists of names.
    Every field is required, so a method cannot leave one out."""

    lossless: bool  # keeps the target's law in sampling mode
    greedy_exact: bool  # at temperature 0 emits exactly the target's greedy tokens
    needs: frozenset[str]  # run-time inputs it may read (of NEEDS)
    law_computed: bool  # the bench computes its first token's exact law (TV from the target)
    exports: bool  # stage=export writes it as a Hugging Face custom_generate folder
    rivals: tuple[str, ...]  # the methods whose best tokens/s it is meant to beat
    record_score: RecordScore | None  # its rule scored on records by stage=evaluate

    def __post_init__(self) -> None:
        unknown = set(self.needs) - NEEDS
        if unknown:
            raise ValueError(f"unknown needs {sorted(unknown)}; choose from {sorted(NEEDS)}")
        if self.lossless and not self.greedy_exact:
            raise ValueError("a lossless method emits the target's greedy tokens at T = 0")


class Method:
    """Base of every engine method. `round` drafts in the rows that still draft, has the
    target check them and says what every row emits; `update` sees each row's outcome once
    it reached the host (what a row remembers between rounds lives in `row.memory`)."""

    name: str
    traits: ClassVar[Traits]

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        raise NotImplementedError

    def update(self, row: Row, drafted: int, accepted: int) -> None:
        """Nothing to remember by default."""

    def first_draft_keeps(
        self, engine: Engine, prompt: list[int], q: torch.Tensor, c: torch.Tensor | None
    ) -> torch.Tensor:
        """(V,) whether the rule keeps each token x as the row's first draft after `prompt` at
        batch size 1 (q, c: the draft's and the companion's warped next-token laws): what the
        bench's exact first-token law reads. A method whose traits say `law_computed`
        defines it (decoding/policies/registry.py checks)."""
        raise NotImplementedError(f"{type(self).__name__} computes no first-token law")


class Verifier(Protocol):
    def __call__(self, engine: Engine, batch: Batch, rnd: Round, step: DraftStep) -> torch.Tensor:
        """(B,) P(q(x)/p(x) <= lambda) for each row's drafted token `step.tokens` (drafted
        after the row's committed tokens and its earlier drafts in `rnd`)."""
        ...


class AcceptanceTable(Protocol):
    prior: float  # P(accept) over all records: what is known before any forward

    def lookup(self, S: torch.Tensor, A: torch.Tensor) -> torch.Tensor: ...

    def lookup_s(self, S: torch.Tensor) -> torch.Tensor:
        """P(accept | S): the table marginalised over A (what is known before a draw)."""
        ...


def step_score(verifier: Verifier, step: DraftStep) -> torch.Tensor:
    """(B,) the score `verifier`'s scorer computed with the step's draw (`draft_round`'s
    `scorer`), shown to a verifier that keeps a tally of its scores (the bench's)."""
    note = getattr(verifier, "note", None)
    score = step.score
    assert score is not None, "a step drawn without its verifier's scorer"
    return score if note is None else note(step, score)


def draft_round(
    engine: Engine,
    batch: Batch,
    limits: list[int],
    stop: Rule | None = None,
    keep: Callable[[int, DraftStep], torch.Tensor] | None = None,
    rnd: Round | None = None,
    scorer: StepScorer | None = None,
) -> Round:
    """Draft up to limits[r] tokens in row r. `keep(j, step)` decides from q_j alone whether
    a row draws its j-th draft (else it stops before it); `stop(step)` says, after the draw,
    that the row's j-th draft is its last; `scorer`: each step's drawn token is scored with
    its draw (`DraftStep.score`, see `Engine.draft_step`). The host reads whether any row
    still drafts only when a rule can stop rows early."""
    rnd = Round() if rnd is None else rnd
    device = engine.device
    limit = engine.tensor(limits)
    counts = torch.zeros(len(batch), dtype=torch.long, device=device)
    active = limit > 0
    adaptive = stop is not None or keep is not None
    for j in range(max(limits, default=0)):
        if j > 0 and adaptive and not engine.any(active):
            break
        step = engine.draft_step(
            batch, rnd, active, None if keep is None else (lambda s, j=j: keep(j, s)), scorer
        )
        rnd.steps.append(step)
        counts = counts + step.active  # bool counts as 0 / 1
        active = step.active & (counts < limit)
        if stop is not None:
            active &= ~stop(step)
    rnd.counts = counts
    return rnd


def verify(engine: Engine, batch: Batch, rnd: Round) -> Emitted:
    """Speculative sampling over every row's drafts: its accepted prefix, then a correction
    from norm(max(0, p - q)) at its first rejection or a bonus token from p."""
    if not rnd.drafted:  # the target's own token, drawn in its graph where it has one
        everyone = torch.ones(len(batch), dtype=torch.bool, device=engine.device)
        draw = Draw(batch.streams.peek()[:, 0])
        p = engine.target_probs(batch, rnd, everyone, draw)
        token = engine.draw(p, batch.verified, batch, draw, everyone)
        none = torch.zeros_like(token)
        return Emitted(token[:, None], none + 1, none, none, none)
    # the drafts' tests and the next token's draw take the rows' next G + 1 numbers: the
    # tests' counts[r], then the draw's; checked in the target's graph where it has one
    drafts = rnd.tokens()
    G = drafts.shape[1]
    check = Check(rnd.q(), drafts, rnd.counts, batch.streams.peek(G + 1))
    accepted, tokens = target_check(engine, batch, rnd, check)
    batch.streams.advance(G + 1, rnd.counts + 1)
    return Emitted(tokens, accepted + 1, accepted, rnd.counts, accepted)


def target_check(
    engine: Engine, batch: Batch, rnd: Round, check: Check
) -> tuple[torch.Tensor, torch.Tensor]:
    """(accepted, tokens): every row's drafts checked by the target's forward, in its graph
    where it has one, else by the same `check.apply` here (outputs transient, as the
    forward's)."""
    everyone = torch.ones(len(batch), dtype=torch.bool, device=engine.device)
    p = engine.target_probs(batch, rnd, everyone, check)
    out = batch.verified
    if out.accepted is None:  # not checked in a graph: the same check here
        _, accepted, tokens = check.apply(p, *check.tensors)
        return accepted, tokens
    return out.accepted, out.emitted


def fixed_round(engine: Engine, batch: Batch, limits: list[int]) -> Round:
    """`draft_round` of limits[r] drafts a row, no rule stopping a row early: one graph of
    the draft's runner where it captures its forwards (`draft_graph`), so the round has no
    host op between its steps; the per-step loop otherwise. Same tokens; the round keeps
    no steps, only what `verify` reads."""
    rnd = captured_round(engine, batch, limits)
    return draft_round(engine, batch, limits) if rnd is None else rnd


def gamma_round(engine: Engine, batch: Batch, gamma: int) -> Emitted:
    """A round of `gamma` drafts a row, verified; gamma 0 is target_only's round (no draft
    forward at all)."""
    if gamma == 0:
        return verify(engine, batch, Round())
    return verify(engine, batch, fixed_round(engine, batch, batch.room(gamma)))


def companion_features(q: torch.Tensor, c: torch.Tensor, x: torch.Tensor) -> tuple:
    """SV's S = sum_v min(q, c) and A = min(1, c(x)/q(x)) per row."""
    S = torch.minimum(q, c).sum(-1)
    q_x = q.gather(1, x[:, None])[:, 0]
    c_x = c.gather(1, x[:, None])[:, 0]
    A = torch.where(q_x > 0, (c_x / q_x.clamp(min=1e-30)).clamp(max=1.0), 0.0)
    return S, A


def overlap(step: DraftStep, c: torch.Tensor) -> torch.Tensor:
    """(B,) SV's S for a draft step, known before its draw, on c's tokens (`on_space_of`)."""
    q, _ = step.on_space_of(c)
    return torch.minimum(q, c).sum(-1)


def step_features(step: DraftStep, c: torch.Tensor) -> tuple:
    """`companion_features` of a drawn draft step, on c's tokens (`on_space_of`)."""
    q, x = step.on_space_of(c)
    return companion_features(q, c, x)


class GoodputMethod(Method):
    """A method that prices its drafts by goodput, (expected tokens + 1) / (drafting time +
    the target's verify), at the engine's timings (`engine.timings`: the target's forward by
    batch size and tokens a row, and one drafting step over the models in `drafting`)."""

    @property
    def drafting(self) -> tuple[str, ...]:
        """The draft-side models one drafting step runs."""
        return ("draft", "companion")

    def costs(self, timings: Timings) -> tuple[Seconds, StepCost]:
        """The target's forward and one drafting step, as goodput's functions take them."""
        return timings.target, timings.step_cost(self.drafting)

    @property
    def prior(self) -> float:
        """A draft's average acceptance before any forward."""
        raise NotImplementedError

    def worth_a_draft(self, timings: Timings, B: int) -> bool:
        """Would one draft a row at the prior acceptance raise the goodput? A round where it
        would not is not drafted at all: otherwise a batch where drafting never pays would
        still spend a drafting step a round to find out."""
        latency, step_cost = self.costs(timings)
        go = round_goodput(self.prior, 1, B, latency, step_cost)
        return go > round_goodput(0.0, 0, B, latency, step_cost)


def captured_round(engine: Engine, batch: Batch, limits: list[int]) -> Round | None:
    """The round of limits[r] drafts a row (none drafting: None) in one graph of the draft's
    runner, when that runner captures its forwards; None otherwise (the caller drafts step by
    step). The streams advance as the loop's steps would: `gamma` numbers shown, each row's
    count taken."""
    runner = getattr(engine, "runners", {}).get("draft")
    gamma = max(limits, default=0)
    if gamma == 0 or runner is None or not runner.captures_rounds:
        return None
    lack = engine.lacking(batch, "draft")
    width = max(len(x) for x in lack)
    ids = engine.send(torch.tensor([x + [0] * (width - len(x)) for x in lack], dtype=torch.long))
    plan = [[len(x), len(x) - 1, limit] for x, limit in zip(lack, limits, strict=True)]
    u = batch.streams.peek(gamma)
    request = RoundRequest(
        ids, engine.send(torch.tensor(plan, dtype=torch.long)), u, engine.sampling
    )
    drafts, probs, counts = runner.run_round(batch.caches["draft"], request)
    batch.streams.advance(gamma, counts)
    batch.stats.draft_calls += gamma
    return Round(counts=counts, calls={"draft": gamma}, drafts=drafts, probs=probs)
