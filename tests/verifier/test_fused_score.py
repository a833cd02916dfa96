"""The in-step score (verifier/fused.py) equals the standalone verifier's on the same rows: a
linear head block by block, the embedding block as a table, the temperature folded in, and
its `apply` (what a draft step's graph runs) drawing the token `Draw` draws and scoring it."""

from __future__ import annotations

import pytest
import torch

from sprinter_train.core.sampling import inverse_cdf
from sprinter_train.decoding.batch import DraftStep
from sprinter_train.decoding.features.table import feature_order
from sprinter_train.models.loading import load_model
from sprinter_train.verifier.checkpoint import load_verifier
from sprinter_train.verifier.scorer import CheckpointVerifier
from tests.scorer_helpers import DRAFT, draft_step, export_verifier, new_batch, width, write_records

ALL = list(feature_order())
DEFAULT = [
    "hidden",
    "token_embedding",
    "q",
    "draft_entropy",
    "draft_margin",
    "draft_entropy_raw",
    "run_position",
    "accept_so_far",
]


@pytest.fixture(scope="module")
def draft_model() -> torch.nn.Module:
    return load_model(DRAFT, "draft", torch.device("cpu"), torch.float32).model


def standalone(verifier: CheckpointVerifier, step: DraftStep, state) -> torch.Tensor:
    """sigmoid((w . s + b) / T) over the whole vector `assemble` builds, as training does."""
    rows = verifier.features(step, state)
    logits = rows @ verifier.weight + verifier.bias
    return torch.sigmoid(logits / verifier.temperature)


@pytest.mark.parametrize("names", [["hidden"], ["token_embedding", "q"], DEFAULT, ALL])
def test_the_in_step_score_is_the_standalone_score(tmp_path, draft_model, names) -> None:
    record = write_records(tmp_path / "toy")
    path = export_verifier(tmp_path / "ck", names, width(names), temperature=1.7)
    verifier = CheckpointVerifier(load_verifier(path), draft_model)
    rows = list(range(12))
    step, batch = draft_step(record, rows), new_batch(record, rows)
    fused = verifier(None, batch, None, step)
    torch.testing.assert_close(fused, standalone(verifier, step, batch.state), rtol=0, atol=2e-6)
    assert fused.std() > 1e-3  # rows scored apart, far beyond the tolerance: an error shows


def test_apply_draws_as_draw_does_and_scores_its_token(tmp_path, draft_model) -> None:
    """`apply(probs, logits, hidden, u, *state)`, the graph's work: the token inverse_cdf
    draws at u, and the score the standalone path gives that token."""
    record = write_records(tmp_path / "toy")
    path = export_verifier(tmp_path / "ck", DEFAULT, width(DEFAULT), temperature=0.8)
    verifier = CheckpointVerifier(load_verifier(path), draft_model)
    scorer = verifier.fused
    assert scorer is not None and scorer.row_fields == ("run", "accepted", "drafted")
    rows = list(range(10))
    step, batch = draft_step(record, rows), new_batch(record, rows)
    u = torch.rand(len(rows), generator=torch.Generator().manual_seed(0))
    scorer.bind(None, step.head_q.shape[-1])
    state = tuple(getattr(batch.state, f) for f in scorer.row_fields)
    drawn, score = scorer.apply(
        step.head_q[:, None], step.head_logits[:, None], step.hidden[:, None], u, *state
    )
    expected_token = inverse_cdf(step.head_q, u)
    assert torch.equal(drawn, expected_token)
    redrawn = draft_step(record, rows)
    redrawn.tokens = drawn
    torch.testing.assert_close(score, standalone(verifier, redrawn, batch.state), rtol=0, atol=2e-6)
