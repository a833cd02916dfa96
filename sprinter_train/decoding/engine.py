"""The decoding engine: owns the models, the sampling and the commit of new tokens.

Policies (policies.py) decide how many tokens to draft and how to verify them; the engine
gives them three operations (draft a token, score tokens with the target, read the companion)
and commits what they return, cutting at EOS and at the token budget.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sprinter_train.core.distributions import entropy
from sprinter_train.core.runtime import synchronize
from sprinter_train.core.sampling import SamplingConfig, sample, warp_probs
from sprinter_train.decoding.runner import ForwardOutput, ModelRunner
from sprinter_train.decoding.state import DecodeStats, SequenceState


@dataclass
class DraftStep:
    token: int
    q: torch.Tensor  # (V,) warped draft distribution the token was drawn from
    hidden: torch.Tensor  # (d,) draft hidden state that produced q
    logits: torch.Tensor  # (V,) the draft's raw logits (entropy-based stopping reads them)

    def entropy(self, warped: bool = False) -> float:
        """H(q) in nats, of the warped q or of the draft's own softmax (temperature 1).

        At low temperature with top-p the warped q is one-hot at most positions (H = 0), so an
        entropy rule on it would never stop drafting; SVIP and AdaEDL default to the raw one.
        """
        probs = self.q if warped else self.logits.float().softmax(-1)
        return float(entropy(probs))


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids, without the prompt
    wall_s: float
    stats: DecodeStats


class Engine:
    """Target, optional draft and companion, one sampling for all of them."""

    def __init__(
        self,
        target: ModelRunner,
        sampling: SamplingConfig,
        draft: ModelRunner | None = None,
        companion: ModelRunner | None = None,
        eos_token_id: int | None = None,
    ) -> None:
        self.target = target
        self.draft = draft
        self.companion = companion
        self.sampling = sampling
        self.eos_token_id = eos_token_id
        self.device = target.device

    # -- the operations policies use ---------------------------------------------------------

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        return warp_probs(logits, self.sampling)

    def sample(self, probs: torch.Tensor, state: SequenceState) -> int:
        return int(sample(probs, state.generator))

    def draft_step(self, state: SequenceState, drafts: Sequence[int]) -> DraftStep:
        """Draw the next draft token after the committed tokens and `drafts`."""
        out = self.call_model(self.require(self.draft, "draft"), state, "draft", list(drafts), 1)
        q = self.warp(out.logits[0])
        return DraftStep(self.sample(q, state), q, out.hidden[0], out.logits[0])

    def target_probs(self, state: SequenceState, drafts: Sequence[int]) -> torch.Tensor:
        """(len(drafts) + 1, V) warped target distributions: at each draft and one past them."""
        out = self.call_model(self.target, state, "target", list(drafts), len(drafts) + 1)
        return self.warp(out.logits)

    def companion_probs(self, state: SequenceState, drafts: Sequence[int]) -> torch.Tensor:
        """(V,) warped companion distribution at the position of the next draft token."""
        out = self.call_model(
            self.require(self.companion, "companion"), state, "companion", drafts, 1
        )
        return self.warp(out.logits[0])

    def call_model(
        self, runner: ModelRunner, state: SequenceState, role: str, drafts: list[int], keep: int
    ) -> ForwardOutput:
        seconds = runner.seconds
        out = runner.extend(state.slot(role), state.tokens + list(drafts), keep)
        setattr(state.stats, f"{role}_calls", getattr(state.stats, f"{role}_calls") + 1)
        elapsed = runner.seconds - seconds
        setattr(state.stats, f"{role}_seconds", getattr(state.stats, f"{role}_seconds") + elapsed)
        return out

    @staticmethod
    def require(runner: ModelRunner | None, role: str) -> ModelRunner:
        if runner is None:
            raise ValueError(f"this policy needs a {role} model (models.{role} in the config)")
        return runner

    # -- generation --------------------------------------------------------------------------

    def new_state(self, prompt_ids: Sequence[int], max_new_tokens: int, seed: int) -> SequenceState:
        if not prompt_ids:
            raise ValueError("a prompt needs at least one token")
        generator = torch.Generator(device="cpu")
        generator.manual_seed(seed)
        state = SequenceState(
            list(prompt_ids), len(prompt_ids), max_new_tokens, generator, self.eos_token_id
        )
        state.finished = max_new_tokens <= 0
        return state

    def commit(self, state: SequenceState, new_tokens: Sequence[int]) -> None:
        """Append a round's tokens, stopping at EOS and at the budget."""
        room = list(new_tokens)[: state.remaining]
        if state.eos_token_id is not None and state.eos_token_id in room:
            room = room[: room.index(state.eos_token_id) + 1]
            state.finished = True
        state.tokens.extend(room)
        state.stats.rounds += 1
        if state.remaining <= 0:
            state.finished = True

    def generate(
        self, prompt_ids: Sequence[int], policy, max_new_tokens: int, seed: int = 0
    ) -> GenerationResult:
        """Run `policy` round by round until EOS or `max_new_tokens`; wall time includes all."""
        state = self.new_state(prompt_ids, max_new_tokens, seed)
        synchronize(self.device)
        start = time.perf_counter()
        while not state.finished:
            self.commit(state, policy.step(self, state))
        synchronize(self.device)
        return GenerationResult(state.generated, time.perf_counter() - start, state.stats)
