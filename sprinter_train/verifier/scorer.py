"""An exported SPRINTER verifier as the engine calls it: features of each row's drafted token.

The parts of the feature vector come from the DraftStep (the draft's hidden state that
produced q, which is the record's `hidden` at t-1; the drafted token's input embedding; q(x);
H(q); the raw logits' margin and entropy) and from the batch's `RowState` (the row's run of
draft-made tokens, its acceptance so far, the target's state at its last verified position),
each computed by its entry of decoding/features/table.py, and are put together by
verifier/features.py's `assemble`, the function training uses.
The score is calibrated, sigmoid((w·s + b) / T) with the sidecar's temperature (1 for old
checkpoints): probabilities a length policy can plan with. SPRINTER's tau = 0.5 keeps the same
decisions under any T, since sigmoid(z / T) >= 0.5 exactly when z >= 0.

`prior` is what a round can expect of a draft before any forward: the train split's mean
label as the sidecar's `class_balance` stores it, the mean min(1, p/q) (the records' own
acceptance) for the soft-label verifier, the share of q/p <= λ for a ratio one. That is the
mean a calibrated score estimates, so a length policy weighs its prior and its per-draft
scores on one scale (at λ = 1 it is below the acceptance: q <= p is only the sure part).
"""

from __future__ import annotations

import time

import torch

from sprinter_train.decoding.batch import Batch, DraftStep, Round, RowState
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.features.table import FEATURES, DecodeInputs, history_features
from sprinter_train.verifier.checkpoint import MLPVerifier, VerifierCheckpoint
from sprinter_train.verifier.features import assemble
from sprinter_train.verifier.fused import FusedLinearScore


class CheckpointVerifier:
    """Callable as policies.Verifier: returns sigmoid((w . s(x, prefix) + b) / T)."""

    def __init__(self, checkpoint: VerifierCheckpoint, draft_model: torch.nn.Module) -> None:
        self.checkpoint = checkpoint
        self.spec = checkpoint.spec
        self.embedding = draft_model.get_input_embeddings()
        self.mlp = checkpoint.model if isinstance(checkpoint.model, MLPVerifier) else None
        self.temperature = checkpoint.temperature
        self.fused: FusedLinearScore | None = None
        if self.mlp is None:
            linear = checkpoint.model.linear
            self.weight = linear.weight.detach().float()[0]
            self.bias = float(linear.bias.detach().float()[0])
            self.width = self.weight.numel()
            settings = dict(self.spec.settings)
            self.fused = FusedLinearScore(
                self.weight,
                self.bias,
                self.temperature,
                self.spec.names,
                settings,
                self.embedding,
                str(checkpoint.path),
            )
        else:
            self.width = int(self.mlp.first.weight.shape[1])
        self.prior = train_base_rate(checkpoint)

    def checked_state(self, state: RowState | None) -> RowState | None:
        """`state`, refused when the spec reads the row's history and there is none."""
        history = history_features() & set(self.spec.names)
        if history and state is None:
            raise ValueError(f"the verifier features {sorted(history)} need the batch's state")
        return state

    def parts(self, step: DraftStep, state: RowState | None = None) -> dict[str, torch.Tensor]:
        """The spec's inputs of each row's drafted token, (B, width) or (B,), on its device,
        each by its feature's `at_decode`; `state`: the batch's, for the features of the
        row's history."""
        names = self.spec.names
        inputs = DecodeInputs(step, self.checked_state(state), self.embedding)
        settings = dict(self.spec.settings)
        return {name: FEATURES[name].at_decode(inputs, settings) for name in names}

    @torch.inference_mode()
    def features(self, step: DraftStep, state: RowState | None = None) -> torch.Tensor:
        """(B, F) feature rows, built by the function training builds them with."""
        rows = assemble(self.spec, self.parts(step, state)).batch()
        if rows.shape[1] != self.width:
            raise ValueError(
                f"verifier {self.checkpoint.path} expects {self.width} features, the "
                f"draft gives {rows.shape[1]}: was it trained on this draft's records?"
            )
        return rows

    def __call__(self, engine: Engine, batch: Batch, rnd: Round, step: DraftStep) -> torch.Tensor:
        """(B,) calibrated sigmoid((w . s(x, prefix) + b) / T) for each row's drafted token: a
        linear head block by block (`FusedLinearScore`), an MLP over the whole vector."""
        start = time.perf_counter()
        state = getattr(batch, "state", None)
        if self.fused is not None:
            with torch.inference_mode():
                score = self.fused(step, self.checked_state(state))
            batch.stats.verifier_seconds += time.perf_counter() - start
            return score
        rows = self.features(step, state)
        if self.mlp is not None:  # train.head=mlp: moved to the draft's device once
            self.mlp = self.mlp.to(rows.device)
            with torch.inference_mode():
                logits = self.mlp.logits(rows)
        else:
            logits = rows @ self.weight.to(rows.device) + self.bias
        score = torch.sigmoid(logits / self.temperature)
        batch.stats.verifier_seconds += time.perf_counter() - start
        return score


def train_base_rate(checkpoint: VerifierCheckpoint) -> float | None:
    """The train split's mean label from the sidecar's class_balance (None for sidecars
    written before it, or without train rows): the mean P(accept) a calibrated score has."""
    key = "mean_accept_prob" if checkpoint.label == "accept_prob" else "positive_fraction"
    train = (checkpoint.meta.get("class_balance") or {}).get("train") or {}
    value = train.get(key)
    return None if value is None else float(value)
