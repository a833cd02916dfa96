"""One policy per method, over a batch of rows that each draft and accept at their own pace.

A policy's `round` drafts in the rows that still draft, has the target check them, and says
what every row emits; what a row must remember between rounds (HF's schedule length) lives in
`row.memory`, updated in `update` once the round's outcome reached the host.

Exactness rule for every length policy: a drafted token is always verified. The decision to
draft token j may use anything fixed before it is drawn (the prefix, q_j, the companion's
c_j and S_j) and the values of the tokens before it; a score computed from x_j's own value
(A_j, features of x_j) may only decide whether to draft x_{j+1}. Then each position is
speculative sampling with a stopping time, and the target's law is kept. Lossless: sd,
sd_heuristic, svip, adaedl, sv, sd_learned. Lossy by design: sprinter (Theorem 3.1's
mixture), mtad (joint-ratio threshold) and sv_paper (the paper's rule, which drops x_j on
A_j's word).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from sprinter_train.core.rules import (
    adaedl_should_stop,
    heuristic_next_gamma,
    mtad_accept_lengths,
    speculative_rows,
    sprinter_check_rows,
    svip_should_stop,
)
from sprinter_train.decoding.companion_plan import CompanionPlan
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.goodput import best_gamma, round_goodput
from sprinter_train.decoding.latency import draft_step_cost, learn, learn_steps
from sprinter_train.decoding.state import Batch, DraftStep, Emitted, Round, Row

Rule = Callable[[DraftStep], torch.Tensor]  # (B,) bool per row


def draft_round(
    engine: Engine,
    batch: Batch,
    limits: list[int],
    stop: Rule | None = None,
    keep: Callable[[int, DraftStep], torch.Tensor] | None = None,
    rnd: Round | None = None,
) -> Round:
    """Draft up to limits[r] tokens in row r. `keep(j, step)` decides from q_j alone whether
    a row draws its j-th draft (else it stops before it); `stop(step)` says, after the draw,
    that the row's j-th draft is its last. The host reads whether any row still drafts only
    when a rule can stop rows early."""
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
            batch, rnd, active, None if keep is None else (lambda s, j=j: keep(j, s))
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
    everyone = torch.ones(len(batch), dtype=torch.bool, device=engine.device)
    p = engine.target_probs(batch, rnd, everyone)
    if not rnd.steps:
        token = engine.sample(p[:, 0], batch, everyone)
        none = torch.zeros_like(token)
        return Emitted(token[:, None], none + 1, none, none, none)
    drafts = rnd.tokens()
    u = batch.streams.uniform(drafts.shape[1], rnd.counts)
    accepted, law = speculative_rows(p, rnd.q(), drafts, rnd.counts, u)
    token = engine.sample(law, batch, everyone)
    tokens = torch.cat([drafts, drafts[:, :1]], 1).scatter(1, accepted[:, None], token[:, None])
    return Emitted(tokens, accepted + 1, accepted, rnd.counts, accepted)


def gamma_round(engine: Engine, batch: Batch, gamma: int) -> Emitted:
    """A round of `gamma` drafts a row, verified; gamma 0 is target_only's round (no draft
    forward at all)."""
    if gamma == 0:
        return verify(engine, batch, Round())
    return verify(engine, batch, draft_round(engine, batch, batch.room(gamma)))


@dataclass
class TargetOnly:
    name: str = "target_only"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        return verify(engine, batch, Round())


class GammaPlan(Protocol):
    """Chooses the drafts a row of sd's next round (decoding/gamma_plan.py's GammaPlanner)."""

    def plan(self, engine: Engine, rows: int, start: int) -> int:
        """From earlier rounds only (what is fixed before the round's first draft)."""
        ...

    def observe(self, drafted: int, accepted: int) -> None: ...


@dataclass
class SpeculativeDecoding:
    """Leviathan et al. with gamma drafts a row per round: fixed, or with a `planner`
    (`gamma: auto` in the bench) chosen before each round from the run's own measurements,
    `gamma` then being where the planner starts. A round of gamma 0 is target_only's round:
    no draft forward."""

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
class HeuristicSD:
    """Hugging Face's schedule, per row: gamma grows by 2 after a fully accepted round, else
    shrinks by 1."""

    gamma_init: int
    gamma_min: int = 1
    name: str = "sd_heuristic"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        limits = [
            max(0, min(row.memory.setdefault("gamma", self.gamma_init), row.remaining - 1))
            for row in batch.rows
        ]
        return verify(engine, batch, draft_round(engine, batch, limits))

    def update(self, row: Row, drafted: int, accepted: int) -> None:
        if drafted:
            row.memory["gamma"] = heuristic_next_gamma(
                row.memory["gamma"], accepted, drafted, self.gamma_min
            )


@dataclass
class SVIP:
    """SVIP Alg. 1: draft until sqrt(c H_q) > h (the token that tripped it is kept)."""

    h: float
    max_gamma: int
    c: float
    warped_entropy: bool = False
    name: str = "svip"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        def stop(step: DraftStep) -> torch.Tensor:
            return svip_should_stop(step.entropy(self.warped_entropy), self.h, self.c)

        return verify(engine, batch, draft_round(engine, batch, batch.room(self.max_gamma), stop))


@dataclass
class AdaEDL:
    """AdaEDL: stop before a token whose entropy bound 1 - sqrt(gamma H_q) falls below lambda
    (decided from q_j before the draw; a row's first draft is always drawn).

    gamma is the bound's constant (the paper's name), not a number of drafts. The threshold is
    fixed (the paper's adaptive-lambda refinement is not implemented).
    """

    gamma: float
    lam: float
    max_gamma: int
    warped_entropy: bool = False
    name: str = "adaedl"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        def keep(j: int, step: DraftStep) -> torch.Tensor:
            if j == 0:
                return torch.ones_like(step.active)
            return ~adaedl_should_stop(step.entropy(self.warped_entropy), self.gamma, self.lam)

        return verify(
            engine, batch, draft_round(engine, batch, batch.room(self.max_gamma), keep=keep)
        )


class Verifier(Protocol):
    def __call__(self, engine: Engine, batch: Batch, rnd: Round, step: DraftStep) -> torch.Tensor:
        """(B,) P(q(x)/p(x) <= lambda) for each row's drafted token `step.tokens` (drafted
        after the row's committed tokens and its earlier drafts in `rnd`)."""
        ...


@dataclass
class Sprinter:
    """SPRINTER Alg. 2 per row: draft while the verifier's score >= tau; the target runs once
    a round, on the rows whose verifier rejected a token, and checks that token only (keep it
    with min(1, p/q), else draw from norm(max(0, p - q))). No bonus token: Alg. 2 returns one
    token per target call, which keeps every position's law (1 - eta_FP) p + eta_FP q.
    A row whose run the verifier accepts up to `max_run` (or its budget) commits it without the
    target; the target's cache catches up at its next call. Tokens kept on the verifier's word
    count as `verifier_accepted`, only the target's check counts as `accepted`.
    """

    verifier: Verifier
    tau: float
    max_run: int
    name: str = "sprinter"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        limits = [max(1, min(self.max_run, row.remaining)) for row in batch.rows]
        rejected = torch.zeros(len(batch), dtype=torch.bool, device=engine.device)
        rnd = Round()

        def stop(step: DraftStep) -> torch.Tensor:
            nonlocal rejected
            score = self.verifier(engine, batch, rnd, step)
            batch.stats.verifier_calls += 1
            said_no = step.active & (score < self.tau)
            rejected = rejected | said_no
            return said_no

        draft_round(engine, batch, limits, stop, rnd=rnd)
        drafts, counts = rnd.tokens(), rnd.counts
        accepted = torch.zeros_like(counts)
        if engine.any(rejected):
            p = engine.target_probs(batch, rnd, rejected)
            last = (counts - 1).clamp(min=0)
            at = last[:, None, None].expand(-1, 1, p.shape[-1])
            p_x, q_x = p.gather(1, at)[:, 0], rnd.q().gather(1, at)[:, 0]
            x = drafts.gather(1, last[:, None])[:, 0]
            u = batch.streams.uniform(1, rejected.long())[:, 0]
            u_fresh = batch.streams.uniform(1, rejected.long())[:, 0]
            passed, token = sprinter_check_rows(p_x, q_x, x, u, u_fresh)
            drafts = drafts.scatter(1, last[:, None], torch.where(rejected, token, x)[:, None])
            accepted = (rejected & passed).long()
        kept = counts - rejected.long()
        return Emitted(drafts, counts, kept, counts, accepted, kept)


class AcceptanceTable(Protocol):
    prior: float  # P(accept) over all records: what is known before any forward

    def lookup(self, S: torch.Tensor, A: torch.Tensor) -> torch.Tensor: ...

    def lookup_s(self, S: torch.Tensor) -> torch.Tensor:
        """P(accept | S): the table marginalised over A (what is known before a draw)."""
        ...


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


@dataclass
class SpecVerification:
    """SV §5 with its batch scheduler, exact.

    Before row r draws its next draft, the table gives that token's acceptance from S alone
    (P(accept | S), fixed before the draw); its gain in expected accepted tokens is that times
    the product of the row's refined acceptances so far, P(accept | S, A) of its drawn drafts.
    Rows draw in order of gain while the batch's estimated goodput, (expected accepted + one
    target token per row) / (drafting time + the profiled target forward at this batch size
    and width), rises; a row that does not draw stops for the round. Every drawn token is
    verified with speculative sampling, so A_j only shapes the decision about x_{j+1}.
    Which rows draft depends on their batch-mates (they share the verification's width), so
    in sampling mode a row's tokens depend on them too; its law does not. Before any forward,
    a round whose average token (the table's prior) would not pay for one drafting step is
    not drafted at all: otherwise a batch where drafting never pays would still spend a draft
    and a companion forward a round to find out. Likewise after each draw, a row whose next
    draft would not pay at its last draft's refined acceptance stops before that draft's
    forwards.
    """

    table: AcceptanceTable
    latency: Callable[[int, int], float]  # (batch size, tokens per row) -> target seconds;
    # a RunningLatency learns from the run's own target forwards (the bench passes one)
    step_cost: Callable[[int], float]  # batch size -> one draft + companion step, seconds;
    # a DraftingCost learns from the run's own steps and prices the draft's alone too
    max_gamma: int
    name: str = "sv"
    # None: every round reads the companion (SV as published); a plan lets rounds skip it, or
    # drafting altogether, where the run measured that they do not pay
    companion_plan: CompanionPlan | None = None

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        learn(self.latency, engine.runners["target"].forward_times())
        learn_steps(self.step_cost, engine.runners)
        B = len(batch)
        rnd = Round()
        plan = self.companion_plan
        mode = "companion" if plan is None else plan.begin(batch, self.latency(B, 1))
        if mode == "target":
            return verify(engine, batch, rnd)
        if mode == "prior":
            return self.prior_round(engine, batch, plan.acceptance.value)  # type: ignore[union-attr]
        if not self.worth_a_draft(B):
            return verify(engine, batch, rnd)
        product = torch.ones(B, dtype=torch.float64, device=engine.device)
        expected = torch.zeros(B, dtype=torch.float64, device=engine.device)
        companion: list[torch.Tensor] = []

        def keep(j: int, step: DraftStep) -> torch.Tensor:
            companion.append(engine.companion_probs(batch, rnd, step.active))
            before = self.table.lookup_s(overlap(step, companion[-1]))
            gain = torch.where(step.active, product * before.double(), 0.0)
            return self.schedule(B, j, expected, gain)

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
            return ~self.schedule(B, len(rnd.steps), expected, foreseen)

        draft_round(engine, batch, batch.room(self.max_gamma), stop, keep, rnd)
        return verify(engine, batch, rnd)

    def prior_round(self, engine: Engine, batch: Batch, alpha: float | None) -> Emitted:
        """A round without the companion: every row drafts the gamma of highest estimated
        goodput at acceptance `alpha` (else the table's prior), each step priced at the
        draft's forward alone; gamma 0 is a target-only round."""
        alpha = float(self.table.prior) if alpha is None else alpha
        cost = draft_step_cost(self.step_cost)
        gamma = best_gamma(alpha, len(batch), self.max_gamma, self.latency, cost)
        return gamma_round(engine, batch, gamma)

    def update(self, row: Row, drafted: int, accepted: int) -> None:
        if self.companion_plan is not None:
            self.companion_plan.observe(drafted, accepted)

    def worth_a_draft(self, B: int) -> bool:
        """Would one draft a row at the table's average acceptance raise the goodput?"""
        go = round_goodput(float(self.table.prior), 1, B, self.latency, self.step_cost)
        return go > round_goodput(0.0, 0, B, self.latency, self.step_cost)

    def schedule(self, B: int, j: int, expected: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        """Which rows draw draft j: the m rows of highest gain, m maximising the estimated
        goodput (m = 0 ends the round for every row). Computed on the device."""
        order = gain.argsort(descending=True)
        cumulative = gain[order].cumsum(0)
        base = expected.sum() + B
        stop_time = j * self.step_cost(B) + self.latency(B, j + 1)
        go_time = (j + 1) * self.step_cost(B) + self.latency(B, j + 2)
        goodput = torch.cat([(base / stop_time)[None], (base + cumulative) / go_time])
        m = goodput.argmax()
        rank = torch.empty_like(order)
        rank[order] = torch.arange(B, device=gain.device)
        return (rank < m) & (gain > 0)


@dataclass
class SpecVerificationPaper:
    """SV §5's rule as published, per row: draw x_j, look up P(accept | S_j, A_j) with A_j
    from x_j itself, and drop x_j (stop) when it would lower the row's goodput. Lossy: whether
    x_j is verified depends on x_j's value, so a verified x_j is no longer distributed as q_j
    (p = q = (1/2, 1/2) with c = (1, 0) emits token 0 with probability 3/4). Kept to measure
    how far the published rule is from the target law."""

    table: AcceptanceTable
    latency: Callable[[int, int], float]
    step_cost: Callable[[int], float]
    max_gamma: int
    name: str = "sv_paper"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        learn(self.latency, engine.runners["target"].forward_times())
        learn_steps(self.step_cost, engine.runners)
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
            before = (expected + 1) / (j * self.step_cost(B) + self.latency(B, j + 1))
            after = (expected + grown + 1) / ((j + 1) * self.step_cost(B) + self.latency(B, j + 2))
            kept = active & (after >= before)
            counts = counts + kept.long()
            product = torch.where(kept, grown, product)
            expected = torch.where(kept, expected + grown, expected)
            active = kept & (counts < limit)
        rnd.counts = counts
        return verify(engine, batch, rnd)


@dataclass
class MTAD:
    """MTAD Alg. 1 per row: beam-sample up to gamma drafts, keep the longest prefix whose
    joint ratio min(1, p(x_1:j)/q(x_1:j)) > tau, then one token from the target after it.

    The draft's cache is widened to rows x beam_width for the round and narrowed back to each
    row's best beam (index selections, as beam search reorders caches; nothing is deep-copied).
    Beam sampling perturbs each candidate's joint log-probability with Gumbel noise from the
    row's own stream before the top-`beam_width` selection (sampling without replacement from
    the joint, Kool et al. 2019); in greedy mode there is no noise, and it is beam search. A
    row whose budget allows fewer drafts freezes its beams once it has them.
    """

    gamma: int
    beam_width: int
    tau: float
    name: str = "mtad"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        limits = batch.room(self.gamma)
        if max(limits, default=0) == 0:
            return verify(engine, batch, Round())
        B, device = len(batch), engine.device
        limit = engine.tensor(limits)
        drafts, q_joint = self._beams(engine, batch, limit, max(limits))
        rnd = Round(counts=limit)
        rnd.steps = [
            DraftStep(drafts[:, j], None, None, None, j < limit) for j in range(drafts.shape[1])
        ]
        everyone = torch.ones(B, dtype=torch.bool, device=device)
        p = engine.target_probs(batch, rnd, everyone)
        p_x = p[:, :-1].gather(2, drafts[..., None])[..., 0]
        accepted = mtad_accept_lengths(p_x, q_joint, limit, self.tau)
        at = accepted[:, None, None].expand(-1, 1, p.shape[-1])
        token = engine.sample(p.gather(1, at)[:, 0], batch, everyone)
        tokens = torch.cat([drafts, drafts[:, :1]], 1).scatter(1, accepted[:, None], token[:, None])
        return Emitted(tokens, accepted + 1, accepted, limit, accepted)

    def _beams(
        self, engine: Engine, batch: Batch, limit: torch.Tensor, steps: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, steps) tokens of each row's best beam and (B, steps) its joint q of each prefix."""
        B, W, device = len(batch), self.beam_width, engine.device
        cache = batch.caches["draft"]
        first = engine.feed(batch, "draft", limit > 0)
        log_q = engine.warp(first.logits[:, 0]).double().log()[:, None, :]  # (B, 1, V)
        V = log_q.shape[-1]
        scores = torch.zeros((B, 1), dtype=torch.float64, device=device)
        history = torch.zeros((B, 1, 0), dtype=torch.long, device=device)
        joint = torch.zeros((B, 1, 0), dtype=torch.float64, device=device)
        rows = torch.arange(B, device=device)
        identity = torch.arange(W, device=device).expand(B, -1)
        parent = identity
        for j in range(steps):
            live = j < limit
            candidates = (scores[..., None] + log_q).reshape(B, -1)  # (B, beams x V)
            keyed = candidates
            if not engine.sampling.greedy:
                u = batch.streams.grid(candidates.shape[1], live.long()).clamp(1e-12, 1 - 1e-12)
                keyed = candidates - torch.log(-torch.log(u))
            top = keyed.topk(W, dim=1).indices
            parent = torch.where(live[:, None], top // V, identity.clamp(max=scores.shape[1] - 1))
            token = torch.where(live[:, None], top % V, 0)
            picked = candidates.gather(1, top)
            scores = torch.where(live[:, None], picked, scores.gather(1, parent))
            spread = parent[..., None].expand(-1, -1, j)
            history = torch.cat([history.gather(1, spread), token[..., None]], 2)
            joint = torch.cat([joint.gather(1, spread), scores[..., None]], 2)
            if j == steps - 1:
                break
            if j == 0:
                cache.select(rows.repeat_interleave(W))
            else:
                cache.select((rows[:, None] * W + parent).flatten())
            keep = torch.zeros((B * W, 1), dtype=torch.long, device=device)
            counts = live.repeat_interleave(W).long()
            out = engine.forward(batch, "draft", token.reshape(-1, 1), counts, keep)
            log_q = engine.warp(out.logits[:, 0]).double().log().reshape(B, W, V)
        best = scores.argmax(1)
        if steps > 1:
            cache.select(rows * W + parent[rows, best])
        return history[rows, best], joint[rows, best].exp()


PRE_DRAW_FEATURES = frozenset({"hidden", "draft_entropy"})  # fixed before x_j is drawn


def scores_before_the_draw(verifier: object) -> bool:
    """Whether a verifier's score of x_j is fixed before x_j is drawn: every feature it reads
    is (the draft hidden state that produced q_j, H(q_j)). A verifier that names no features,
    or reads any of x_j's own (its embedding, q(x_j)), counts as scoring after the draw."""
    names = getattr(getattr(verifier, "spec", None), "names", None)
    return bool(names) and set(names) <= PRE_DRAW_FEATURES


@dataclass
class LearnedLength:
    """sd_learned: speculative sampling whose drafting length a trained predictor chooses, per
    row, lossless.

    Each draft's acceptance is estimated by the verifier (calibrated P(accept)) and, with a
    table, SV's P(accept | S) before the draw and P(accept | S, A) after it (their mean). A row
    draws its next draft while that raises its estimated goodput, (E(N | gamma) + 1) /
    (gamma drafting steps + the profiled target forward over gamma + 1 tokens at this batch
    size); every drawn draft is verified. Exact by the module's rule: a verifier that reads
    only features fixed before x_j is drawn (`hidden`, `draft_entropy`) decides whether x_j
    is drawn; one that reads x_j's own (`token_embedding`, `q`) only refines the product of
    acceptances that later drafts are weighed by (without a table a row's first draft is then
    always drawn). After each draw, x_j's acceptance stands in for the next draft's: a row
    whose next draft would not pay at it stops before that draft's forward, so a round does
    not end on a drafting step spent to learn that no draft pays (as sv does). The batch size
    enters the latency, so in sampling mode a row's tokens depend on how many rows it decodes
    beside; its law does not. A round whose average draft (the predictors' prior) would not
    pay for one drafting step is not drafted at all.
    """

    verifier: Verifier  # its `spec.names` say which features it reads (CheckpointVerifier's)
    table: AcceptanceTable | None
    latency: Callable[[int, int], float]  # (batch size, tokens per row) -> target seconds;
    # a RunningLatency learns from the run's own target forwards (the bench passes one)
    step_cost: Callable[[int], float]  # batch size -> one drafting step, seconds
    max_gamma: int
    name: str = "sd_learned"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        learn(self.latency, engine.runners["target"].forward_times())
        learn_steps(self.step_cost, engine.runners)
        B = len(batch)
        rnd = Round()
        if not self.worth_a_draft(B):
            return verify(engine, batch, rnd)
        before_draw = scores_before_the_draw(self.verifier)
        product = torch.ones(B, dtype=torch.float64, device=engine.device)
        expected = torch.zeros(B, dtype=torch.float64, device=engine.device)
        companion: list[torch.Tensor] = []
        scored: list[torch.Tensor] = []  # the verifier's pre-draw score of the current draft

        def rises(drafts: int, gain: torch.Tensor) -> torch.Tensor:
            """Whether one more draft, worth `gain` expected tokens, raises the goodput."""
            now = round_goodput(expected, drafts, B, self.latency, self.step_cost)
            more = round_goodput(expected + gain, drafts + 1, B, self.latency, self.step_cost)
            return more > now

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
            return rises(j, product * torch.stack(estimates).mean(0))

        def stop(step: DraftStep) -> torch.Tensor:
            nonlocal product, expected
            estimates = [scored[0] if before_draw else score(step)]
            if self.table is not None:
                S, A = step_features(step, companion[-1])
                estimates.append(self.table.lookup(S, A).double())
            acceptance = torch.stack(estimates).mean(0)
            product = torch.where(step.active, product * acceptance, product)
            expected = torch.where(step.active, expected + product, expected)
            return ~rises(len(rnd.steps), product * acceptance)

        informed = before_draw or self.table is not None  # a score known before the draw
        room = batch.room(self.max_gamma)
        draft_round(engine, batch, room, stop, keep if informed else None, rnd)
        return verify(engine, batch, rnd)

    @property
    def prior(self) -> float:
        """A draft's average acceptance before any forward: the table's and the verifier's
        `prior` where they have one, else 1 (skip drafting only where even a sure draft would
        not pay)."""
        priors = [] if self.table is None else [float(self.table.prior)]
        if getattr(self.verifier, "prior", None) is not None:
            priors.append(float(self.verifier.prior))  # type: ignore[attr-defined]
        return sum(priors) / len(priors) if priors else 1.0

    def worth_a_draft(self, B: int) -> bool:
        """Would one draft a row at the predictors' average acceptance raise the goodput?"""
        go = round_goodput(self.prior, 1, B, self.latency, self.step_cost)
        return go > round_goodput(0.0, 0, B, self.latency, self.step_cost)
