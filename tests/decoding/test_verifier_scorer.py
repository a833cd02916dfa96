"""The decoder's verifier (CheckpointVerifier on a DraftStep) scores a drafted token exactly as
training scored its record: both build the feature vector through features.assemble. Its score
is calibrated with the sidecar's temperature, which leaves SPRINTER's tau = 0.5 decisions as
they were."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from sprinter_train.core.half import FLOAT16_MAX
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.decoding.batch import DraftStep
from sprinter_train.decoding.builder import build_engine, build_runner
from sprinter_train.decoding.features.table import feature_order
from sprinter_train.decoding.policies import Sprinter
from sprinter_train.harvest.reader import open_records
from sprinter_train.models.loading import load_model
from sprinter_train.verifier.checkpoint import load_verifier
from sprinter_train.verifier.data import split_features
from sprinter_train.verifier.features import (
    DraftEmbedder,
    FeatureSpec,
    assemble,
)
from sprinter_train.verifier.scorer import CheckpointVerifier
from tests.decoding_helpers import PACK_EVERY
from tests.scorer_helpers import (
    DRAFT,
    SETTINGS,
    VOCAB,
    D,
    draft_step,
    export_verifier,
    new_batch,
    width,
    write_records,
)


@pytest.fixture(scope="module")
def draft_model() -> torch.nn.Module:
    return load_model(DRAFT, "draft", torch.device("cpu"), torch.float32).model


@pytest.mark.parametrize(
    "names",
    [
        ["hidden"],
        ["hidden", "token_embedding", "q", "draft_entropy"],
        ["draft_entropy", "q"],
        ["token_embedding"],
        ["draft_margin", "draft_entropy_raw", "run_position", "accept_so_far"],
        list(feature_order()),
    ],
)
def test_training_and_decoding_score_a_record_alike(tmp_path, draft_model, names) -> None:
    record = write_records(tmp_path / "toy")
    checkpoint = load_verifier(export_verifier(tmp_path / "ck", names, width(names)))
    records = open_records(tmp_path / "toy")
    spec = FeatureSpec.from_names(names, SETTINGS)
    features, rows = split_features(records, None, spec, DraftEmbedder(DRAFT))
    trained = checkpoint.score(features.batch())
    verifier = CheckpointVerifier(checkpoint, draft_model)
    batch = new_batch(record, list(rows))
    decoded = verifier(None, batch, None, draft_step(record, list(rows))).numpy()
    assert ((trained > 0.02) & (trained < 0.98)).mean() >= 0.75  # unsaturated: errors show
    np.testing.assert_allclose(decoded, trained, rtol=0, atol=1e-5)


def test_a_feature_count_mismatch_names_the_checkpoint(tmp_path, draft_model) -> None:
    record = write_records(tmp_path / "toy")
    path = export_verifier(tmp_path / "ck", ["hidden", "q"], D + 2)  # trained on another width
    verifier = CheckpointVerifier(load_verifier(path), draft_model)
    with pytest.raises(ValueError, match=re.escape(str(path)) + r".*expects 26 features.*25"):
        verifier(None, new_batch(), None, draft_step(record, [0]))


def test_the_vector_follows_feature_order_whatever_the_sidecar_lists(tmp_path, draft_model):
    record = write_records(tmp_path / "toy")
    step = draft_step(record, [3])
    path = export_verifier(tmp_path / "ck", ["draft_entropy", "hidden", "q"], D + 2)
    vector = CheckpointVerifier(load_verifier(path), draft_model).features(step)[0]
    q = step.q[0]
    q_x = float(q[step.tokens[0]])
    entropy = float(-(q[q > 0] * q[q > 0].log()).sum())
    torch.testing.assert_close(vector[:D], step.hidden[0])
    assert vector[D:].tolist() == pytest.approx([q_x, entropy], rel=1e-6)


def test_the_call_returns_one_probability_a_row_and_counts_its_time(tmp_path, draft_model):
    record = write_records(tmp_path / "toy")
    verifier = CheckpointVerifier(
        load_verifier(export_verifier(tmp_path / "ck", ["hidden"], D)), draft_model
    )
    batch = new_batch()
    scores = verifier(None, batch, None, draft_step(record, [0, 1, 2]))
    assert scores.shape == (3,) and bool(((scores > 0) & (scores < 1)).all())
    assert batch.stats.verifier_seconds > 0
    # a row's score does not depend on the rows beside it
    alone = verifier(None, batch, None, draft_step(record, [1]))
    torch.testing.assert_close(alone[0], scores[1])
    # the counter accumulates: one more call adds to it
    before = batch.stats.verifier_seconds
    verifier(None, batch, None, draft_step(record, [4]))
    assert batch.stats.verifier_seconds > before


def test_decoding_rounds_dense_features_as_records_store_them(tmp_path, draft_model) -> None:
    """A float32 hidden state is rounded to float16 and clamped to its range (no inf), which is
    what the harvest writes and what the verifier was fitted on."""
    record = write_records(tmp_path / "toy")
    step = draft_step(record, [0])
    hidden = (torch.linspace(-1e6, 1e6, D) + 1e-4)[None]
    step = DraftStep(step.tokens, step.q, hidden, step.logits, step.active)
    verifier = CheckpointVerifier(
        load_verifier(export_verifier(tmp_path / "ck", ["hidden"], D)), draft_model
    )
    vector = verifier.features(step)
    expected = hidden.clamp(-FLOAT16_MAX, FLOAT16_MAX).half().float()
    assert torch.isfinite(vector).all()
    torch.testing.assert_close(vector, expected, rtol=0, atol=0)


def test_assemble_names_a_missing_part() -> None:
    spec = FeatureSpec.from_names(["hidden", "q"])
    with pytest.raises(ValueError, match=r"\['q'\] were not given"):
        assemble(spec, {"hidden": torch.zeros(2, 3)})


def test_the_call_applies_the_sidecars_temperature(tmp_path, draft_model) -> None:
    record = write_records(tmp_path / "toy")
    names = ["hidden", "q"]
    checkpoint = load_verifier(export_verifier(tmp_path / "ck", names, D + 1, temperature=3.0))
    features, rows = split_features(
        open_records(tmp_path / "toy"), None, FeatureSpec.from_names(names)
    )
    logits = checkpoint.logits(features.batch())
    decoded = CheckpointVerifier(checkpoint, draft_model)(
        None, new_batch(), None, draft_step(record, list(rows))
    ).numpy()
    np.testing.assert_allclose(decoded, 1 / (1 + np.exp(-logits / 3.0)), rtol=0, atol=1e-5)
    np.testing.assert_allclose(decoded, checkpoint.calibrated_score(features.batch()), atol=1e-5)
    raw = checkpoint.score(features.batch())
    assert np.abs(decoded - raw).max() > 0.05  # T = 3 flattens them: not the raw sigmoid
    assert ((decoded >= 0.5) == (raw >= 0.5)).all()


def test_sprinters_decisions_do_not_depend_on_the_temperature(tmp_path, draft_model) -> None:
    """sigmoid(z / T) >= 0.5 exactly when z >= 0: SPRINTER at tau = 0.5 drafts, trusts and
    checks the same tokens whatever T the sidecar holds, row for row, in sampling mode."""
    target = load_model(
        {"path": "tiny_random", "seed": 1, "config": {"num_hidden_layers": 3}},
        "target",
        torch.device("cpu"),
        torch.float32,
    ).model
    engine = build_engine(
        build_runner(target, VOCAB),
        SamplingConfig(temperature=0.9, top_k=20),
        VOCAB,
        draft=build_runner(draft_model, VOCAB),
        pack_every=PACK_EVERY,
    )
    d = draft_model.config.hidden_size
    prompts = [[5, 17, 9, 33], [40, 41, 42, 43, 44, 45, 46], [7, 8], [60, 61, 62]] * 2
    runs = {}
    for temperature in (None, 0.2, 5.0):
        path = export_verifier(tmp_path / f"ck-{temperature}", ["hidden"], d, 0, temperature, 0.5)
        verifier = CheckpointVerifier(load_verifier(path), draft_model)
        assert verifier.temperature == (temperature or 1.0)
        results = engine.generate(prompts, Sprinter(verifier, tau=0.5, max_run=4), 16)
        stats = results[0].stats
        counts = (stats.drafted, stats.accepted, stats.verifier_accepted, stats.target_calls)
        runs[temperature] = ([r.tokens for r in results], counts)
    drafted, _, trusted, _ = runs[None][1]
    assert 0 < trusted < drafted  # the verifier says both yes and no: decisions are tested
    assert runs[0.2] == runs[None] and runs[5.0] == runs[None]
