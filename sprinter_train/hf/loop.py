"""The generation loop at batch 1: rounds of a method, each committing what it emits.

The engine's commit (sprinter_train/decoding/engine.py) for one row: every cache keeps the
tokens before the round plus the drafts it kept, the emitted tokens are cut at the budget
(max_new_tokens) and then after the first EOS, and the counts the bench reports add up.
Transformers' stopping criteria (MaxLength, EOS, and any the caller adds) are asked after
each committed token, so a stop string ends the output where HF's own loop would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .sampling import Sampling, inverse_cdf, uniform, warp_probs
from .side import Outputs, Side


@dataclass
class Stats:
    """What the bench reports per generation; a forward counts as one call."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0  # drafts the target's check kept
    verifier_accepted: int = 0  # drafts committed on the verifier's word (sprinter)
    target_calls: int = 0
    draft_calls: int = 0
    companion_calls: int = 0


@dataclass
class Emitted:
    """A round's tokens, of which the first `kept` are drafts every cache may keep."""

    tokens: list[int]
    kept: int
    drafted: int
    accepted: int
    verifier_accepted: int = 0


@dataclass
class Pair:
    """Target, draft and optional companion of one generation, with the committed sequence."""

    target: Side
    draft: Side
    companion: Side | None
    sampling: Sampling
    sequence: list[int]
    remaining: int  # new tokens the budget still allows
    generator: torch.Generator | None = None
    stats: Stats = field(default_factory=Stats)

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        return warp_probs(logits, self.sampling)

    def uniform(self) -> torch.Tensor:
        return uniform(self.target.device, self.generator)

    def sample(self, probs: torch.Tensor) -> int:
        """One token from (V,) probabilities."""
        return int(inverse_cdf(probs, self.uniform()))

    def room(self, limit: int) -> int:
        """At most `limit` drafts, leaving room for the target's token in the budget."""
        return max(0, min(limit, self.remaining - 1))

    def side_output(self, side: Side | None, j: int, drafts: list[int]) -> Outputs:
        """A draft-side model's j-th call of a round: what it lacks of the committed tokens
        (j = 0), else the round's draft j - 1."""
        if side is None:
            raise ValueError("this method needs a companion model: pass companion_model=")
        return side.feed(self.sequence) if j == 0 else side.feed_one(drafts[j - 1])


Method = Callable[[Pair], Emitted]
Stop = Callable[[list[int]], bool]  # the committed sequence -> stop now


def decode(pair: Pair, method: Method, eos: set[int], stop: Stop | None = None) -> Stats:
    """Rounds of `method` until the budget, an EOS token or `stop`; returns the counts."""
    sides = [s for s in (pair.target, pair.draft, pair.companion) if s is not None]
    finished = pair.remaining <= 0
    while not finished:
        emitted = method(pair)
        start = len(pair.sequence)
        for side in sides:
            side.crop(start + emitted.kept)
        stats = pair.stats
        stats.rounds += 1
        stats.drafted += emitted.drafted
        stats.accepted += emitted.accepted
        stats.verifier_accepted += emitted.verifier_accepted
        for token in emitted.tokens[: pair.remaining]:
            pair.sequence.append(token)
            pair.remaining -= 1
            if token in eos or (stop is not None and stop(pair.sequence)):
                finished = True
                break
        finished = finished or pair.remaining <= 0
    pair.stats.target_calls = pair.target.calls
    pair.stats.draft_calls = pair.draft.calls
    pair.stats.companion_calls = 0 if pair.companion is None else pair.companion.calls
    return pair.stats
