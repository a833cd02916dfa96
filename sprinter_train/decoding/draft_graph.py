"""A draft round of fixed length in one captured graph: the gamma draft steps (the forward,
the warp, the draw and the step's bookkeeping) recorded together, one graph per (row bucket,
first block's width, gamma, cache, attention span), so a round of `sd` replays two graphs,
the draft round and the target's verify, with no host op between its draft steps.

A step's host work in the per-step loop (`policies.base.draft_round`) is what the graph holds
here: the next block is the step's own drawn token, the rows still drafting are
`active & (drafted < limit)`, and step j of row r draws at the row's next number after the
ones its earlier steps took (u[r, drafted[r]] of the round's `RowStreams.peek(gamma)`), so
the tokens are the loop's, bit for bit. What the graph keeps is what the verify reads: the
drafts, their laws on the vocabulary and each row's count (`state.Round.drafts`).

Only a round whose length is fixed before its first draft takes this path (`fixed_round`:
`sd`, `sd_heuristic`). Policies that stop drafting per token (`svip`, `adaedl`, `sv`,
`sd_learned`, `sprinter`, the oracle and the online rules) decide on the host after each
step, from the step's outputs, and keep the per-step graphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.decoding.after_warp import Draw
from sprinter_train.decoding.forward import BlockShape, Recorded
from sprinter_train.decoding.state import Batch, Round, spread

if TYPE_CHECKING:
    from sprinter_train.decoding.engine import Engine
    from sprinter_train.decoding.graphs import CapturedBackend


@dataclass(frozen=True)
class RoundRequest(BlockShape):
    """Up to `gamma` drafts a row: the first step feeds ids[r, :plan[r, 0]] (what the draft's
    cache lacks) and keeps offset plan[r, 1]; row r drafts plan[r, 2] tokens at most, drawn
    at u[r, k] (rows, gamma), its next numbers."""

    ids: torch.Tensor
    plan: torch.Tensor
    u: torch.Tensor
    warp: SamplingConfig

    @property
    def gamma(self) -> int:
        return self.u.shape[1]


@dataclass(frozen=True)
class RoundPlan:
    """What a draft round's graph freezes (part of its key): the warp and the steps."""

    warp: SamplingConfig
    gamma: int


def record_round(
    backend: CapturedBackend,
    ids: torch.Tensor,
    plan: torch.Tensor,
    u: torch.Tensor,
    kv: Any,
    recorded: RoundPlan,
    span: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a draft round's graph records over the row bucket: `recorded.gamma` steps of the
    per-step loop, each what a step's own graph records (`record_forward`: the static
    forward on the restricted head, its warp, the draw and the broken-logits watch), then
    the loop's bookkeeping; (drafts (rows, G), their laws (rows, G, V), drafts a row)."""
    head = backend.head
    step = Recorded(restricted=True, warp=recorded.warp, then=Draw)
    limit = plan[:, 2]
    active = limit > 0
    counts, keep, block = plan[:, 0] * active, plan[:, 1:2], ids
    drafted = torch.zeros_like(limit)
    tokens, laws = [], []
    for _ in range(recorded.gamma):
        drawn_at = u.gather(1, drafted[:, None])[:, 0]
        _, _, _, probs, drawn = backend.record_forward(
            block, keep, counts, drawn_at, kv=kv, recorded=step, span=span
        )
        token = drawn if head.support is None else head.support[drawn]
        tokens.append(token)
        laws.append(probs[:, 0])
        drafted = drafted + active
        active = active & (drafted < limit)
        block, counts, keep = token[:, None], active.long(), torch.zeros_like(keep)
    probs = torch.stack(laws, 1)
    if head.support is not None:
        probs = spread(probs, head.support, head.vocab_size, 0.0)
    return torch.stack(tokens, 1), probs, drafted


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
