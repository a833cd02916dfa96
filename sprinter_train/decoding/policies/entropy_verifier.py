"""The draft's raw entropy as a verifier: a hand rule sprinter's decoder can run in place of
its trained verifier (`verifier: {kind: entropy}`, and the lossy frontier's `entropy` rule,
bench/quality/frontier.py).

The score of a drafted token is exp(−H) with H the entropy of the draft's own softmax
(temperature 1, `DraftStep.entropy()`, as svip and adaedl read it) at the position the token
was drawn from: 1 for a one-hot draft, falling towards 1/V for a flat one. Sprinter drafts on
while the score is >= τ, so a draft goes to the target unchecked while H <= ln(1/τ): higher τ
is stricter, as with the trained verifier. The score is fixed before the draw (`pre_draw`).
"""

from __future__ import annotations

import torch

from sprinter_train.decoding.batch import Batch, DraftStep, Round
from sprinter_train.decoding.engine import Engine

KIND = "entropy"  # the `verifier.kind` that asks for it


def entropy_score(raw_entropy: torch.Tensor) -> torch.Tensor:
    """exp(−H): in (0, 1], decreasing in the entropy."""
    return torch.exp(-raw_entropy.float())


class EntropyVerifier:
    """Callable as policies.Verifier: (B,) exp(−H) of the draft's raw softmax at each row's
    drafted position. Learns nothing and has no train split: no `observe`, no prior."""

    pre_draw = True  # H(q_j) is known before x_j is drawn
    prior = None  # no training data's mean label to start a goodput estimate from

    def __call__(self, engine: Engine, batch: Batch, rnd: Round, step: DraftStep) -> torch.Tensor:
        return entropy_score(step.entropy(warped=False))

    def record(self) -> dict[str, str]:
        """What results.json records of it."""
        return {"kind": KIND, "score": "exp(-H) of the draft's raw softmax"}
