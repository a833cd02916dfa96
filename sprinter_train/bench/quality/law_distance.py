"""How far a method's rule puts the first generated token from the target's law, exactly.

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
sampling noise, cheap enough to run on real models beside the bench. Each policy whose
traits say `law_computed` gives keep(x) itself (`Method.first_draft_keeps`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sprinter_train.core.rules import residual_rows
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import Method

ROLES = ("target", "draft", "companion")


def first_token_law(p: torch.Tensor, q: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """(V,) law of the first token when a drawn x ~ q is verified if keep[x], else dropped."""
    p, q, kept = p.double(), q.double(), keep.double()
    ratio = torch.where(q > 0, (p / q.clamp(min=1e-300)).clamp(max=1.0), 0.0)
    rejected = (q * kept * (1 - ratio)).sum()
    dropped = (q * (1 - kept)).sum()
    return q * kept * ratio + rejected * residual_rows(p, q) + dropped * p


def next_token_laws(
    engine: Engine, prompts: Sequence[Sequence[int]], roles: Sequence[str] = ROLES
) -> dict[str, torch.Tensor]:
    """(k, V) warped distributions of each of `roles` after each prompt."""
    batch = engine.new_batch(prompts, 2, range(len(prompts)))
    everyone = torch.ones(len(prompts), dtype=torch.bool, device=engine.device)
    return {role: engine.warp(engine.feed(batch, role, everyone).logits[:, 0]) for role in roles}


def first_token_tv(engine: Engine, policy: Method, prompts: Sequence[Sequence[int]]) -> list[float]:
    """TV between the rule's first-token law and the target's, per prompt; the rule's first
    draft is the policy's own `first_draft_keeps` (a method whose traits say `law_computed`)."""
    companion = engine.companion is not None and "companion" in policy.traits.needs
    laws = next_token_laws(engine, prompts, ROLES if companion else ROLES[:2])
    out = []
    for k, (p, q) in enumerate(zip(laws["target"], laws["draft"], strict=True)):
        c = laws["companion"][k] if companion else None
        keep = policy.first_draft_keeps(engine, list(prompts[k]), q, c)
        law = first_token_law(p, q, keep)
        out.append(0.5 * float((law - p.double()).abs().sum()))
    return out
