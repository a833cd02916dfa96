"""Typical acceptance: Medusa's lossy rule, the target keeps the drafts its own law finds
plausible enough.

Medusa (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads", §2.3.1; FasterDecoding/Medusa, `medusa/model/utils.py`,
`evaluate_posterior`) keeps the longest prefix of candidates whose every token x satisfies

    p(x) > min(ε, δ · exp(−H(p)))

with p the base model's distribution at that position, ε `posterior_threshold` and δ
`posterior_alpha` (the authors recommend δ = sqrt(ε): their defaults are ε 0.09, δ 0.3),
then the base model's own token follows. A confident p (low entropy) asks for p(x) near
ε; a flat p admits any draft it gives more than δ · exp(−H) of its mass.

Here the candidates are the draft's `gamma` tokens a row, the target checks the block in one
forward, and p is the target's law under the engine's sampling (temperature, top-k, top-p
applied to p as to every method's). Two details of Medusa's code are kept as they are: the
comparison is strict, and at temperature 0 the rule is greedy matching (Medusa's code
branches to it; here it follows from the rule itself: the warped p is one-hot, H = 0, and
the threshold min(ε, δ) is below 1, so a draft passes exactly when it is the target's
argmax). So at temperature 0 the method emits the target's greedy tokens; with sampling it
does not keep the target's law (lossless: false). One departure: H is the exact entropy of p
(0 log 0 = 0) where Medusa's code adds 1e-5 inside the log.

After the accepted prefix the row emits one token drawn from the target's p at the first
position not accepted (the bonus position after a fully accepted block), with the row's own
stream numbers: Medusa's base-model token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from sprinter_train.core.distributions import entropy
from sprinter_train.decoding.batch import Batch, Emitted, Round
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies.base import Method, Traits, fixed_round, verify


def typical_threshold(p: torch.Tensor, epsilon: float, delta: float) -> torch.Tensor:
    """(...,) min(ε, δ exp(−H(p))) at each position of `p` (..., V), in float32."""
    h = entropy(p.float())
    return torch.minimum(torch.full_like(h, float(epsilon)), float(delta) * torch.exp(-h))


def typical_accept_lengths(
    p: torch.Tensor, drafts: torch.Tensor, counts: torch.Tensor, epsilon: float, delta: float
) -> torch.Tensor:
    """(B,) how many leading drafts pass p_j(x_j) > min(ε, δ exp(−H(p_j))), among each row's
    counts[r].

    p: (B, G, V) the target's law at each draft's position; drafts: (B, G)."""
    p_x = p.gather(2, drafts[..., None])[..., 0].float()
    passed = p_x > typical_threshold(p, epsilon, delta)
    passed &= torch.arange(p.shape[1], device=p.device)[None, :] < counts[:, None]
    return passed.long().cumprod(1).sum(1)


@dataclass
class TypicalAcceptance(Method):
    """Medusa's typical acceptance over `gamma` drafts a row (the module's text): the target
    checks them in one forward and keeps the longest prefix whose tokens it finds typical
    (p(x) > min(ε, δ exp(−H(p)))), then emits its own token. `delta` None: sqrt(`epsilon`),
    Medusa's recommendation, so the frontier's ladder over ε moves both. Higher ε is stricter:
    both terms of the threshold grow with it."""

    # every trait spelt out (Traits has no defaults): the blocks look alike on purpose
    traits: ClassVar[Traits] = Traits(
        lossless=False,
        greedy_exact=True,
        needs=frozenset(),
        law_computed=False,
        exports=False,
        rivals=("sd",),
        record_score=None,
    )

    gamma: int
    epsilon: float
    delta: float | None = None
    name: str = "typical"

    @property
    def alpha(self) -> float:
        """δ, Medusa's `posterior_alpha`: the configured one, else sqrt(ε)."""
        return math.sqrt(self.epsilon) if self.delta is None else float(self.delta)

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        limits = batch.room(self.gamma)
        if max(limits, default=0) == 0:
            return verify(engine, batch, Round())
        rnd = fixed_round(engine, batch, limits)
        everyone = torch.ones(len(batch), dtype=torch.bool, device=engine.device)
        p = engine.target_probs(batch, rnd, everyone)  # (B, G + 1, V)
        drafts, counts = rnd.tokens(), rnd.counts
        accepted = typical_accept_lengths(p[:, :-1], drafts, counts, self.epsilon, self.alpha)
        rows = torch.arange(len(batch), device=engine.device)
        token = engine.sample(p[rows, accepted], batch, everyone)
        tokens = torch.cat([drafts, drafts[:, :1]], 1).scatter(1, accepted[:, None], token[:, None])
        return Emitted(tokens, accepted + 1, accepted, counts, accepted)
