"""One policy per method: how many tokens to draft, and how the target checks them.

A policy's `step` runs one round for one sequence and returns the tokens to commit; anything
it must remember between rounds (HF's schedule length) lives in `state.memory`.
Lossless policies (sd, sd_heuristic, svip, adaedl, sv) only choose *how many* tokens to draft
from draft-side information and verify with speculative sampling, so they keep the target's
distribution; sprinter and mtad trade exactness for speed as their papers describe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from sprinter_train.core.rules import (
    adaedl_should_stop,
    heuristic_next_gamma,
    mtad_accept_length,
    speculative_step,
    sprinter_continue,
    sprinter_verify_last,
    sv_goodput,
    svip_should_stop,
)
from sprinter_train.decoding.beam import beam_draft
from sprinter_train.decoding.engine import DraftStep, Engine
from sprinter_train.decoding.state import SequenceState

StopRule = Callable[[DraftStep], bool]  # True: this drafted token is the round's last


class Policy(Protocol):
    name: str

    def step(self, engine: Engine, state: SequenceState) -> list[int]: ...


def draft_room(state: SequenceState, gamma: int) -> int:
    """At most gamma drafts, leaving room for the target's own token within the budget."""
    return max(0, min(gamma, state.remaining - 1))


def draft_tokens(
    engine: Engine, state: SequenceState, limit: int, stop: StopRule | None = None
) -> list[DraftStep]:
    steps: list[DraftStep] = []
    while len(steps) < limit:
        step = engine.draft_step(state, [s.token for s in steps])
        steps.append(step)
        if stop is not None and stop(step):
            break
    return steps


def verify(engine: Engine, state: SequenceState, steps: list[DraftStep]) -> list[int]:
    """Speculative sampling over the drafts: accepted prefix + correction or bonus token."""
    drafts = [s.token for s in steps]
    p_rows = engine.target_probs(state, drafts)
    if not drafts:
        return [engine.sample(p_rows[0], state)]
    q_rows = torch.stack([s.q for s in steps])
    n, token = speculative_step(p_rows, q_rows, drafts, state.generator)
    state.stats.drafted += len(drafts)
    state.stats.accepted += n
    return drafts[:n] + [token]


@dataclass
class TargetOnly:
    name: str = "target_only"

    def step(self, engine: Engine, state: SequenceState) -> list[int]:
        return verify(engine, state, [])


@dataclass
class SpeculativeDecoding:
    """Leviathan et al. with a fixed number gamma of drafts per round."""

    gamma: int
    name: str = "sd"

    def step(self, engine: Engine, state: SequenceState) -> list[int]:
        return verify(engine, state, draft_tokens(engine, state, draft_room(state, self.gamma)))


@dataclass
class HeuristicSD:
    """Hugging Face's schedule: gamma grows by 2 after a fully accepted round, else shrinks by 1."""

    gamma_init: int
    gamma_min: int = 1
    name: str = "sd_heuristic"

    def step(self, engine: Engine, state: SequenceState) -> list[int]:
        gamma = state.memory.setdefault("gamma", self.gamma_init)
        steps = draft_tokens(engine, state, draft_room(state, gamma))
        out = verify(engine, state, steps)
        if steps:
            state.memory["gamma"] = heuristic_next_gamma(
                gamma, len(out) - 1, len(steps), self.gamma_min
            )
        return out


@dataclass
class SVIP:
    """SVIP Alg. 1: draft until sqrt(c H_q) > h (the token that tripped it is kept)."""

    h: float
    max_gamma: int
    c: float
    warped_entropy: bool = False
    name: str = "svip"

    def step(self, engine: Engine, state: SequenceState) -> list[int]:
        def stop(step: DraftStep) -> bool:
            return svip_should_stop(step.entropy(self.warped_entropy), self.h, self.c)

        return verify(
            engine, state, draft_tokens(engine, state, draft_room(state, self.max_gamma), stop)
        )


@dataclass
class AdaEDL:
    """AdaEDL: stop before a token whose entropy bound 1 - sqrt(gamma H_q) falls below lambda.

    gamma is the bound's constant (the paper's name), not a number of drafts. The threshold is
    fixed (the paper's adaptive-lambda refinement is not implemented).
    """

    gamma: float
    lam: float
    max_gamma: int
    warped_entropy: bool = False
    name: str = "adaedl"

    def step(self, engine: Engine, state: SequenceState) -> list[int]:
        steps: list[DraftStep] = []
        for _ in range(draft_room(state, self.max_gamma)):
            step = engine.draft_step(state, [s.token for s in steps])
            H = step.entropy(self.warped_entropy)
            if steps and adaedl_should_stop(H, self.gamma, self.lam):
                break  # the first draft is always kept: a round must try at least one
            steps.append(step)
        return verify(engine, state, steps)


class Verifier(Protocol):
    def __call__(
        self, engine: Engine, state: SequenceState, drafts: list[int], step: DraftStep
    ) -> float:
        """P(q(x)/p(x) <= lambda) for the drafted token `step.token` after `drafts`."""
        ...


@dataclass
class Sprinter:
    """SPRINTER Alg. 2: draft while the verifier's score >= tau; the target runs once, on the
    first token the verifier rejects, and verifies that token only (accept with
    min(1, p/q), else resample from norm(max(0, p - q))). No bonus token: Alg. 2 returns one
    token per target call, which keeps every position's law (1 - eta_FP) p + eta_FP q.
    A run the verifier accepts up to `max_run` (or the token budget) is committed without a
    target call; the target's cache catches up on those tokens at its next call. Tokens kept on
    the verifier's word count as `verifier_accepted`, only the target's check counts as
    `accepted`, so sprinter's acceptance rate means what sd's does.
    """

    verifier: Verifier
    tau: float
    max_run: int
    name: str = "sprinter"

    def step(self, engine: Engine, state: SequenceState) -> list[int]:
        limit = max(1, min(self.max_run, state.remaining))
        steps: list[DraftStep] = []
        while len(steps) < limit:
            drafts = [s.token for s in steps]
            step = engine.draft_step(state, drafts)
            steps.append(step)
            score = self.verifier(engine, state, drafts, step)
            state.stats.verifier_calls += 1
            if not sprinter_continue(score, self.tau):
                break
        else:  # the verifier accepted the whole run: commit it, the target catches up later
            state.stats.drafted += len(steps)
            state.stats.verifier_accepted += len(steps)
            return [s.token for s in steps]
        drafts = [s.token for s in steps]
        p_rows = engine.target_probs(state, drafts)
        r = len(drafts)
        token = sprinter_verify_last(p_rows[r - 1], steps[-1].q, drafts[-1], state.generator)
        state.stats.drafted += r
        state.stats.verifier_accepted += r - 1
        state.stats.accepted += int(token == drafts[-1])
        return drafts[:-1] + [token]


@dataclass
class SpecVerification:
    """SV §5: grow the verified length while the estimated goodput E(N|gamma)/latency rises.

    Each drafted token's acceptance P(T_i | S, A) comes from the companion's S = sum min(q, c)
    and A = min(1, c(x)/q(x)) looked up in the fitted table; latency(gamma) is the profiled
    target forward over gamma + 1 tokens plus gamma draft and companion steps. The token that
    would lower the goodput is dropped, so verification stays speculative sampling.
    """

    table: Callable[[float, float], float]
    latency: Callable[[int], float]
    max_gamma: int
    name: str = "sv"

    def step(self, engine: Engine, state: SequenceState) -> list[int]:
        steps: list[DraftStep] = []
        accept: list[float] = []
        best = sv_goodput(accept, 0, self.latency(0))
        for _ in range(draft_room(state, self.max_gamma)):
            drafts = [s.token for s in steps]
            step = engine.draft_step(state, drafts)
            c = engine.companion_probs(state, drafts)
            q_x = float(step.q[step.token])
            S = float(torch.minimum(step.q, c).sum())
            A = min(1.0, float(c[step.token]) / q_x) if q_x > 0 else 0.0
            accept.append(float(self.table(S, A)))
            goodput = sv_goodput(accept, len(accept), self.latency(len(accept)))
            if goodput < best:
                break
            best = goodput
            steps.append(step)
        return verify(engine, state, steps)


@dataclass
class MTAD:
    """MTAD Alg. 1: beam-sample gamma drafts, keep the longest prefix whose joint ratio
    min(1, p(x_1:j)/q(x_1:j)) > tau, then one token from the target at the next position."""

    gamma: int
    beam_width: int
    tau: float
    name: str = "mtad"

    def step(self, engine: Engine, state: SequenceState) -> list[int]:
        limit = draft_room(state, self.gamma)
        if limit == 0:
            return verify(engine, state, [])
        drafts, q_joint = beam_draft(engine, state, limit, self.beam_width)
        p_rows = engine.target_probs(state, drafts)
        n = mtad_accept_length(p_rows, q_joint, drafts, self.tau)
        state.stats.drafted += len(drafts)
        state.stats.accepted += n
        return drafts[:n] + [engine.sample(p_rows[n], state)]
