"""What one forward of a runner takes (`ForwardRequest`) and gives (`RowOutput`), what a
forward's graph freezes (`Recorded`), and the same for a draft round of fixed length in one
graph (`RoundRequest`, `RoundPlan`).

A request is one object, so a backend, or the capture wrapping one, reads what it needs
from it instead of having the options handed down call by call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.decoding.runner.after_warp import AfterWarp


class BlockShape:
    """The rows and width of a request's block of token ids (rows, width)."""

    ids: torch.Tensor

    @property
    def rows(self) -> int:
        return self.ids.shape[0]

    @property
    def width(self) -> int:
        return self.ids.shape[1]


@dataclass(frozen=True)
class ForwardRequest(BlockShape):
    """Append ids[r, :counts[r]] to row r and return the outputs at block offsets keep[r, k]
    (clamped into the block, so a row's unused entries may point anywhere).

    `restricted`: logits over a restricted head's own tokens (`RowOutput.support`). `warp`:
    the sampling the caller will warp the logits with; `then` (with `warp`): what it will do
    with the warped laws (`after_warp`). A captured backend does both in its graph; the
    others leave them to the caller, which runs the same code. `transient`: the caller is
    done with every output before the runner's next forward, so a captured backend may hand
    back views of its graph's buffers instead of copies."""

    ids: torch.Tensor
    counts: torch.Tensor
    keep: torch.Tensor
    restricted: bool = False
    warp: SamplingConfig | None = None
    then: AfterWarp | None = None
    transient: bool = False

    @property
    def after_warp(self) -> AfterWarp | None:
        """`then`, which only applies to a warped forward."""
        return None if self.warp is None else self.then


@dataclass(frozen=True)
class Recorded:
    """What a captured graph freezes of a request (part of its key): the head, the warp and
    the kind of work after it."""

    restricted: bool
    warp: SamplingConfig | None
    then: Any  # the after-warp's `recorded`: a Draw or Check class, or a StepScorer

    @classmethod
    def of(cls, request: ForwardRequest) -> Recorded:
        then = request.after_warp
        return cls(request.restricted, request.warp, None if then is None else then.recorded)


@dataclass
class RowOutput:
    logits: torch.Tensor  # (rows, keep, V) float32 on the shared vocabulary
    hidden: torch.Tensor  # (rows, keep, d) the hidden state verifiers read
    # when set, `logits` are (rows, keep, K) over these K ascending vocabulary ids only (a
    # restricted head's tokens: every other token's logit is -inf)
    support: torch.Tensor | None = None
    # (rows, keep, d_model) the final hidden state (the head's input) at the same positions
    final: torch.Tensor | None = None
    # `logits` warped by the request's `warp`, where the backend did it (in a captured
    # graph); None: the caller warps
    probs: torch.Tensor | None = None
    # (rows,) the token of the request's `then` (`after_warp`), drawn in the captured graph
    # (into `logits`' columns: a head index when `support` is set); None: the caller draws
    drawn: torch.Tensor | None = None
    # (rows,) the drafts each row's `Check` accepted, in the captured graph; None: not checked
    accepted: torch.Tensor | None = None
    # (rows, G + 1) the round's tokens `Check` emits (accepted drafts, then `drawn`)
    emitted: torch.Tensor | None = None
    # (rows,) the drawn draft's verifier score (`DrawScore`), in the captured graph
    score: torch.Tensor | None = None


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
