"""What the engine does with a forward's warped distributions, in a form a captured graph can
record after its warp: draw the row's next token (`Draw`), or check a round's drafts by
speculative sampling and draw the correction or bonus (`Check`).

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

import torch

from sprinter_train.core.rules import speculative_step
from sprinter_train.core.sampling import inverse_cdf


@dataclass(frozen=True)
class Draw:
    """The token at uniforms u (rows,) of the first kept offset's warped law (a head index
    where the forward's logits are on a restricted head)."""

    u: torch.Tensor

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

    q: torch.Tensor
    drafts: torch.Tensor
    counts: torch.Tensor
    u: torch.Tensor

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


AfterWarp = Draw | Check
