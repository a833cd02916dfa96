"""What the engine does with a forward's warped distributions, in a form a captured graph can
record after its warp: draw the row's next token (`Draw`), or check a round's drafts by
speculative sampling and draw the correction or bonus (`Check`), or draw a draft and score
it with a trained verifier from what the step holds (`DrawScore`).

On a GPU every op the engine runs outside its graphs is a launch and host time, and the
draw and the check are a large share of a round's ops (`benchmarks/host_ops.py` counts
them). A runner that captures its forwards is handed one of these with its request
(`ForwardRequest.then`) and replays it with the body (`RowOutput.drawn`,
`RowOutput.accepted`); any other runner leaves it to the caller, which then calls the same
`apply` itself, so both give the same tokens. The uniforms are the rows' next numbers, shown before the forward
(`RowStreams.peek`) and taken after (`advance`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from sprinter_train.core.rules import speculative_step
from sprinter_train.core.sampling import inverse_cdf


@dataclass(frozen=True)
class Draw:
    """The token at uniforms u (rows,) of the first kept offset's warped law (a head index
    where the forward's logits are on a restricted head)."""

    reads_forward: ClassVar[bool] = False  # `apply` takes the warped laws alone
    fields: ClassVar[tuple[str, ...]] = ("drawn",)  # the RowOutput fields `apply` fills

    u: torch.Tensor

    @property
    def recorded(self) -> type[Draw]:
        """What a captured graph keys and runs after its warp: this class's `apply`."""
        return type(self)

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.u,)

    @staticmethod
    def apply(probs: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(token,) from (rows, keep, V) warped laws."""
        return (inverse_cdf(probs[:, 0], u),)


@dataclass(frozen=True)
class Check:
    """Speculative sampling's check of a verify block (`policies.base.verify`): row r drafted
    drafts[r, :counts[r]] from q[r] (rows, G, V), the target's laws at them and one past
    them are the forward's warped outputs; u (rows, G + 1) holds the tests' uniforms and, at
    counts[r], the draw's."""

    reads_forward: ClassVar[bool] = False
    fields: ClassVar[tuple[str, ...]] = ("drawn", "accepted", "emitted")

    q: torch.Tensor
    drafts: torch.Tensor
    counts: torch.Tensor
    u: torch.Tensor

    @property
    def recorded(self) -> type[Check]:
        return type(self)

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.q, self.drafts, self.counts, self.u)

    @staticmethod
    def apply(
        probs: torch.Tensor,
        q: torch.Tensor,
        drafts: torch.Tensor,
        counts: torch.Tensor,
        u: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """(token, accepted, emitted): the next token, each row's accepted drafts, and the
        round's tokens (its accepted drafts, then the token, at most G + 1 a row)."""
        accepted, token = speculative_step(probs, q, drafts, counts, u)
        emitted = torch.cat([drafts, drafts[:, :1]], 1).scatter(
            1, accepted[:, None], token[:, None]
        )
        return token, accepted, emitted


class StepScorer(Protocol):
    """A verifier that scores a draft step's drawn token from the step's own outputs (its
    raw head logits, warped laws and hidden state) and the row tensors it names."""

    reads_forward: ClassVar[bool]  # True: `apply` takes (probs, logits, hidden, *tensors)
    fields: ClassVar[tuple[str, ...]]  # ("drawn", "score")
    row_fields: tuple[str, ...]  # the RowState fields it reads, in the order it takes them

    def apply(
        self, probs: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor, *tensors: Any
    ) -> tuple[torch.Tensor, ...]:
        """(drawn, score): `Draw`'s token at the uniforms `tensors[0]`, then
        `score_drawn`'s score of it (the row tensors after the uniforms)."""
        ...

    def score_drawn(
        self,
        probs: torch.Tensor,
        logits: torch.Tensor,
        hidden: torch.Tensor,
        drawn: torch.Tensor,
        *state: torch.Tensor,
    ) -> torch.Tensor: ...

    def bind(self, support: torch.Tensor | None, vocab_size: int) -> None: ...


@dataclass(frozen=True)
class DrawScore:
    """`Draw`, then the drafted token's score by `scorer` (a linear verifier, block by
    block: verifier/fused.py), in the draft step's graph where it has one, so a learned
    round's scoring costs no host op of its own. `state`: the row tensors the scorer reads
    (its `row_fields` of the batch's RowState, the run already counting this round's
    earlier drafts)."""

    # the outputs a captured forward copies out of its graph: the step's logits and hidden
    # state are read before the next forward only (the score was computed from them), so a
    # DraftStep of a scored step holds views of the graph's buffers there
    lasting: ClassVar[tuple[str, ...]] = ("probs", "drawn", "score")

    u: torch.Tensor
    state: tuple[torch.Tensor, ...]
    scorer: StepScorer

    @property
    def recorded(self) -> StepScorer:
        """The scorer: one graph a scorer, its weights held by the graph."""
        return self.scorer

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.u, *self.state)

    def draw(self, probs: torch.Tensor) -> torch.Tensor:
        """Where no graph drew: `Draw`'s token, the one the scorer's `apply` draws."""
        return Draw.apply(probs, self.u)[0]

    def score(
        self, probs: torch.Tensor, logits: torch.Tensor, hidden: torch.Tensor, drawn: torch.Tensor
    ) -> torch.Tensor:
        """Where no graph scored: the scorer's score of `drawn`, as its `apply` gives it."""
        return self.scorer.score_drawn(probs, logits, hidden, drawn, *self.state)


AfterWarp = Draw | Check | DrawScore
