"""How far SV's rules and sd_learned put the first generated token from the target's law, exactly.

At a row's first draft (j = 0, batch size 1) x ~ q is drawn and the rule either keeps x,
which speculative sampling then verifies (x with probability min(1, p(x)/q(x)), else a token
from norm(max(0, p - q))), or drops it, and the token comes from p. With keep(x) the rule's
decision for each token x of the vocabulary, the first token's law is

    P(t) = q(t) keep(t) min(1, p(t)/q(t))
         + norm(max(0, p - q))(t) * sum_x q(x) keep(x) (1 - min(1, p(x)/q(x)))
         + p(t) * sum_x q(x) (1 - keep(x)).

A decision fixed before the draw (exact sv: P(accept | S) and the scheduler) keeps P = p;
the published rule (sv_paper) decides from A(x), x's own value, and P moves away from p.
Enumerating keep(x) over the vocabulary gives TV(P, p) with one forward per model: no
sampling noise, cheap enough to run on real models beside the bench.

sd_learned's decision on its first draft is taken from one real round of the policy on the
prompt (its verifier, table and the latency it has learned by then): the engine asks a
policy's `keep` before it draws (the step's token is a placeholder then), and a score of x
itself only decides whether x_{j+1} is drafted, so that decision is one for every x.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sprinter_train.core.rules import residual_rows
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import (
    LearnedLength,
    SpecVerification,
    SpecVerificationPaper,
    companion_features,
)
from sprinter_train.decoding.timings import Timings

ROLES = ("target", "draft", "companion")
SVPolicy = SpecVerification | SpecVerificationPaper
LawPolicy = SVPolicy | LearnedLength  # the rules whose first-token law the bench computes


def first_token_law(p: torch.Tensor, q: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """(V,) law of the first token when a drawn x ~ q is verified if keep[x], else dropped."""
    p, q, kept = p.double(), q.double(), keep.double()
    ratio = torch.where(q > 0, (p / q.clamp(min=1e-300)).clamp(max=1.0), 0.0)
    rejected = (q * kept * (1 - ratio)).sum()
    dropped = (q * (1 - kept)).sum()
    return q * kept * ratio + rejected * residual_rows(p, q) + dropped * p


def keeps(policy: SVPolicy, timings: Timings, q: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """(V,) whether the rule keeps each token x as the row's first draft, at batch size 1,
    pricing its rounds at `timings` (the engine's)."""
    V = q.shape[-1]
    if policy.max_gamma < 1:
        return torch.zeros(V, dtype=torch.bool, device=q.device)
    S = companion_features(q[None], c[None], torch.zeros(1, dtype=torch.long, device=q.device))[0]
    if isinstance(policy, SpecVerificationPaper):  # SpecVerificationPaper.round at j = 0, B = 1
        # A(x) for every x, as companion_features computes it for the drawn one
        A = torch.where(q > 0, (c / q.clamp(min=1e-30)).clamp(max=1.0), 0.0)
        grown = policy.table.lookup(S.expand(V), A).double()
        expected = torch.zeros(V, dtype=torch.float64, device=q.device)
        latency, step_cost = policy.costs(timings)
        before = (expected + 1) / (0 * step_cost(1) + latency(1, 1))
        after = (expected + grown + 1) / (step_cost(1) + latency(1, 2))
        return after >= before
    if not policy.worth_a_draft(timings, 1):  # SpecVerification.round: no draft this round
        return torch.zeros(V, dtype=torch.bool, device=q.device)
    gain = policy.table.lookup_s(S).double()  # decided before the draw: one for all x
    expected = torch.zeros(1, dtype=torch.float64, device=q.device)
    return policy.schedule(timings, 1, 0, expected, gain).expand(V)


def drafts_first(engine: Engine, policy: LearnedLength, prompt: Sequence[int]) -> bool:
    """Whether sd_learned draws a first draft after `prompt` at batch size 1: one round of
    the policy with room for one draft, committed so the engine is left as a round leaves it."""
    batch = engine.new_batch([prompt], 2, [0])
    engine.commit(batch, policy.round(engine, batch))
    return batch.stats.drafted > 0


def next_token_laws(
    engine: Engine, prompts: Sequence[Sequence[int]], roles: Sequence[str] = ROLES
) -> dict[str, torch.Tensor]:
    """(k, V) warped distributions of each of `roles` after each prompt."""
    batch = engine.new_batch(prompts, 2, range(len(prompts)))
    everyone = torch.ones(len(prompts), dtype=torch.bool, device=engine.device)
    return {role: engine.warp(engine.feed(batch, role, everyone).logits[:, 0]) for role in roles}


def first_token_tv(
    engine: Engine, policy: LawPolicy, prompts: Sequence[Sequence[int]]
) -> list[float]:
    """TV between the rule's first-token law and the target's, per prompt."""
    learned = isinstance(policy, LearnedLength)  # reads no companion here
    laws = next_token_laws(engine, prompts, ROLES[:2] if learned else ROLES)
    out = []
    for k, (p, q) in enumerate(zip(laws["target"], laws["draft"], strict=True)):
        if learned:
            keep = torch.full_like(q, drafts_first(engine, policy, prompts[k]), dtype=torch.bool)
        else:
            keep = keeps(policy, engine.timings, q, laws["companion"][k])
        law = first_token_law(p, q, keep)
        out.append(0.5 * float((law - p.double()).abs().sum()))
    return out
