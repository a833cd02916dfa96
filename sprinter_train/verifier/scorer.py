"""An exported SPRINTER verifier as the engine calls it: features of one drafted token.

The feature vector is built exactly as at training time (verifier/features.py's order): the
draft's hidden state that produced q (the record's `hidden` at t-1), then the drafted token's
input embedding, q(x) and H(q) when the checkpoint's spec lists them.
"""

from __future__ import annotations

import time

import torch

from sprinter_train.core.distributions import entropy
from sprinter_train.decoding.engine import DraftStep, Engine
from sprinter_train.decoding.state import SequenceState
from sprinter_train.verifier.checkpoint import VerifierCheckpoint


class CheckpointVerifier:
    """Callable as policies.Verifier: returns sigmoid(w . s(x, prefix) + b)."""

    def __init__(self, checkpoint: VerifierCheckpoint, draft_model: torch.nn.Module) -> None:
        self.checkpoint = checkpoint
        self.names = checkpoint.spec.names
        self.embedding = draft_model.get_input_embeddings()
        linear = checkpoint.model.linear
        self.weight = linear.weight.detach().float()[0]
        self.bias = float(linear.bias.detach().float()[0])

    @torch.inference_mode()
    def features(self, step: DraftStep) -> torch.Tensor:
        parts = []
        for name in self.names:
            if name == "hidden":
                parts.append(step.hidden.float().flatten())
            elif name == "token_embedding":
                token = torch.tensor([step.token], device=step.hidden.device)
                parts.append(self.embedding(token).float().flatten())
            elif name == "q":
                parts.append(step.q[step.token].float().reshape(1))
            elif name == "draft_entropy":
                parts.append(entropy(step.q.float()).reshape(1))
        vector = torch.cat([p.cpu() for p in parts])
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
