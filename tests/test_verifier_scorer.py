"""The decoder's verifier (CheckpointVerifier on a DraftStep) scores a drafted token exactly as
training scored its record: both build the feature vector through features.assemble. Its score
is calibrated with the sidecar's temperature, which leaves SPRINTER's tau = 0.5 decisions as
they were."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from sprinter_train.core.distributions import raw_entropy, top2_margin
from sprinter_train.core.half import FLOAT16_MAX
from sprinter_train.core.io import write_json
from sprinter_train.core.sampling import SamplingConfig, warp_probs
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import Sprinter
from sprinter_train.decoding.runner import ModelRunner
from sprinter_train.decoding.state import DecodeStats, DraftStep, RowState
from sprinter_train.harvest.continuations import HarvestSequence
from sprinter_train.harvest.mixes import MIXES
from sprinter_train.harvest.reader import open_records
from sprinter_train.harvest.records import RecordBatch, history_columns, token_statistics
from sprinter_train.harvest.schema import SCHEMA_VERSION
from sprinter_train.harvest.shards import ShardPlan, write_shard
from sprinter_train.models.loading import load_model
from sprinter_train.verifier.checkpoint import load_verifier, save_verifier, verifier_path
from sprinter_train.verifier.data import split_features
from sprinter_train.verifier.features import (
    FEATURE_ORDER,
    DraftEmbedder,
    FeatureSpec,
    assemble,
)
from sprinter_train.verifier.scorer import CheckpointVerifier

DRAFT = {"path": "tiny_random", "seed": 2, "config": {"num_hidden_layers": 1}}
VOCAB, EMBED = 128, 64  # the tiny draft's vocabulary and embedding width
D, ROWS = 24, 40  # recorded hidden width (any: the verifier only reads it), records
HISTORY = ("run_position", "accepted_before", "drafts_before")
TARGET_D = 16  # the recorded target hidden width
SETTINGS = {"run_position_cap": 3, "accept_prior": 0.4, "accept_n0": 2.0}
WIDTHS = {"hidden": D, "token_embedding": EMBED, "target_hidden": TARGET_D}


def write_records(experiment_dir: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """ROWS records written by the harvest's own writer, columns from token_statistics."""
    generator = torch.Generator().manual_seed(seed)
    q = warp_probs(2 * torch.randn(ROWS, VOCAB, generator=generator), SamplingConfig(top_k=40))
    p = torch.randn(ROWS, VOCAB, generator=generator).softmax(-1)
    x = q.argmax(-1)  # any token with q(x) > 0 will do: no sampler in the test
    hidden = torch.randn(ROWS, D, generator=generator).half()
    columns: dict[str, np.ndarray] = {
        "prompt_id": np.full(ROWS, "toy-0", dtype=object),
        "dataset": np.full(ROWS, "toy", dtype=object),
        "split": np.full(ROWS, "test", dtype=object),
        "mix": np.full(ROWS, MIXES[0], dtype=object),
        "position": np.arange(1, ROWS + 1, dtype=np.int32),
        "token_id": x.numpy().astype(np.int32),
        "S": np.full(ROWS, np.nan, dtype=np.float32),
        "A": np.full(ROWS, np.nan, dtype=np.float32),
    }
    for name, values in token_statistics(q, p, None, x).items():
        columns[name] = values.numpy().astype(np.float32)
    logits = q.log()  # the draft step's raw logits (below)
    columns["draft_margin"] = top2_margin(logits).numpy()
    columns["draft_entropy_raw"] = raw_entropy(logits).numpy()
    prompt = Prompt("toy-0", "toy", "test", "", [], None)
    plan = ShardPlan(0, (prompt,), (MIXES[0],))
    flags = tuple(bool(f) for f in torch.rand(ROWS + 1, generator=generator) < 0.7)
    sequence = HarvestSequence(prompt, MIXES[0], [1] * (ROWS + 1), 1, ROWS + 1, flags)
    columns.update(history_columns(sequence, columns["accept_prob"]))
    records_dir = experiment_dir / "records"
    records_dir.mkdir(parents=True)
    target = torch.randn(ROWS, TARGET_D, generator=generator).half()
    columns["target_margin"] = torch.rand(ROWS, generator=generator).numpy() * 3
    batch = RecordBatch(columns, hidden.numpy(), target.numpy())
    write_shard(records_dir, plan, batch, [sequence], "toy")
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "experiment": experiment_dir.name,
        "models": {"draft": {"id": "tiny_random"}},
        "companion": False,
        "hidden": {"layer": -1, "d": D, "dtype": "float16"},
        "target_hidden": {"d": TARGET_D, "dtype": "float16"},
        "shards": [{"name": plan.name, "rows": ROWS}],
    }
    write_json(records_dir / "manifest.json", manifest)
    history = {k: torch.from_numpy(columns[k]) for k in HISTORY}
    margin = torch.from_numpy(columns["target_margin"])
    return {
        "q": q,
        "x": x,
        "hidden": hidden,
        "target_hidden": target,
        "target_margin": margin,
        **history,
    }


def export_verifier(
    checkpoint_dir: Path,
    names: list[str],
    d_in: int,
    seed: int = 0,
    temperature: float | None = None,
    bias: float | None = None,
) -> Path:
    """A verifier with random weights, exported as stage=train exports one (with a
    calibration temperature when one is given; without, an old sidecar)."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(d_in, generator=generator) / d_in**0.5
    b = torch.randn(1, generator=generator) if bias is None else torch.tensor([bias])
    meta: dict = {"lam": 1.0, "features": {"names": names, "settings": SETTINGS}}
    if temperature is not None:
        meta["label"] = "ratio"
        meta["calibration"] = {"method": "temperature", "temperature": temperature}
    return save_verifier(verifier_path(checkpoint_dir, 1.0), weight, b, meta)


def width(names: list[str]) -> int:
    return sum(WIDTHS.get(n, 1) for n in names)


def draft_step(record: dict[str, torch.Tensor], rows: list[int]) -> DraftStep:
    """The engine's view of records' drafted tokens as a batch's rows (their hidden states
    in float32)."""
    index = torch.tensor(rows)
    q = record["q"][index]
    active = torch.ones(len(rows), dtype=torch.bool)
    return DraftStep(record["x"][index].long(), q, record["hidden"][index].float(), q.log(), active)


def new_batch(record: dict[str, torch.Tensor] | None = None, rows: list[int] = ()) -> Any:
    """What the verifier reads of a batch: its stats, and the rows' state where the records'
    history is given (each record the first draft of its round: step index 0)."""
    state = None
    if record is not None:
        index = torch.tensor(list(rows))
        state = RowState(
            record["run_position"][index].long(),
            record["accepted_before"][index].float(),
            record["drafts_before"][index].float(),
            record["target_hidden"][index].float(),
            record["target_margin"][index].float(),
        )
    return SimpleNamespace(stats=DecodeStats(), state=state)


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
        list(FEATURE_ORDER),
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
    engine = Engine(
        ModelRunner(target, VOCAB),
        SamplingConfig(temperature=0.9, top_k=20),
        draft=ModelRunner(draft_model, VOCAB),
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
