"""An exported SPRINTER verifier as the engine calls it: features of one drafted token.

The parts of the feature vector come from the DraftStep (the draft's hidden state that
produced q, which is the record's `hidden` at t-1; the drafted token's input embedding; q(x);
H(q)) and are put together by verifier/features.py's `assemble`, the function training uses.
"""

from __future__ import annotations

import time

import torch

from sprinter_train.core.distributions import entropy
from sprinter_train.decoding.engine import DraftStep, Engine
from sprinter_train.decoding.state import SequenceState
from sprinter_train.verifier.checkpoint import VerifierCheckpoint
from sprinter_train.verifier.features import assemble


class CheckpointVerifier:
    """Callable as policies.Verifier: returns sigmoid(w . s(x, prefix) + b)."""

    def __init__(self, checkpoint: VerifierCheckpoint, draft_model: torch.nn.Module) -> None:
        self.checkpoint = checkpoint
        self.spec = checkpoint.spec
        self.embedding = draft_model.get_input_embeddings()
        linear = checkpoint.model.linear
        self.weight = linear.weight.detach().float()[0]
        self.bias = float(linear.bias.detach().float()[0])

    def parts(self, step: DraftStep) -> dict[str, torch.Tensor]:
        """The spec's inputs of the drafted token as one row each, on the CPU."""
        names = self.spec.names
        parts = {}
        if "hidden" in names:
            parts["hidden"] = step.hidden.reshape(1, -1)
        if "token_embedding" in names:
            token = torch.tensor([step.token], device=step.hidden.device)
            parts["token_embedding"] = self.embedding(token).reshape(1, -1)
        if "q" in names:
            parts["q"] = step.q[step.token].float().reshape(1)
        if "draft_entropy" in names:
            parts["draft_entropy"] = entropy(step.q.float()).reshape(1)
        return {name: part.cpu() for name, part in parts.items()}

    @torch.inference_mode()
    def features(self, step: DraftStep) -> torch.Tensor:
        vector = assemble(self.spec, self.parts(step)).batch()[0]
        if vector.numel() != self.weight.numel():
            raise ValueError(
                f"verifier {self.checkpoint.path} expects {self.weight.numel()} features, the "
                f"draft gives {vector.numel()}: was it trained on this draft's records?"
            )
        return vector

    def __call__(
        self, engine: Engine, state: SequenceState, drafts: list[int], step: DraftStep
    ) -> float:
        start = time.perf_counter()
        score = torch.sigmoid(self.features(step) @ self.weight + self.bias)
        state.stats.verifier_seconds += time.perf_counter() - start
        return float(score)
