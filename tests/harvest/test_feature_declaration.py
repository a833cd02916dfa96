"""A verifier feature is declared once (decoding/features/table.py) and every stage reads the
declaration: one registered in a test is harvested, checked, trained on, evaluated and
computed by the decoder on the tiny models with no other file touched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from sprinter_train.__main__ import run_stage
from sprinter_train.core.config import compose_config
from sprinter_train.core.io import read_json, write_json
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.features.table import (
    FEATURES,
    Array,
    Column,
    DecodeInputs,
    Feature,
    feature_columns,
    feature_order,
    history_features,
    pre_draw_features,
    recorded_arrays,
    register,
)
from sprinter_train.decoding.policies import scores_before_the_draw
from sprinter_train.harvest.continuations import HarvestSequence
from sprinter_train.harvest.manifest import array_sections
from sprinter_train.harvest.reader import array_widths, open_records
from sprinter_train.harvest.records import array_widths as model_widths
from sprinter_train.harvest.records import harvest_batch
from sprinter_train.harvest.schema import BASE_COLUMNS, SCHEMA_VERSION, record_schema
from sprinter_train.harvest.shards import (
    ShardPlan,
    array_kinds,
    out_of_range,
    sha256_keys,
    shard_files,
    write_shard,
)
from sprinter_train.verifier.checkpoint import load_verifier, verifier_path
from sprinter_train.verifier.data import rows_features
from sprinter_train.verifier.features import FeatureSpec
from tests.chain_helpers import TINY_CHAIN
from tests.harvest_helpers import generating_models

DECODED: list[torch.Tensor] = []  # what the decoder computed of the test's feature


def _decoded_q_max(inputs: DecodeInputs, settings: object) -> torch.Tensor:
    value = inputs.step.head_q.max(-1).values.float()
    DECODED.append(value)
    return value


# the test's feature: the largest warped draft probability at the position, max_v q_t(v)
Q_MAX = Feature(
    "q_max",
    "max_v q(v), the draft's confidence before x is drawn",
    from_records=lambda records, settings: records.column("q_max"),
    at_decode=_decoded_q_max,
    columns=(
        Column(
            "q_max",
            "max_v q_t(v)",
            low=0.0,
            high=1.0,
            finite=True,
            at_position=lambda at: at.q.max(-1).values,
        ),
    ),
    pre_draw=True,
)


@pytest.fixture
def q_max() -> Iterator[Feature]:
    """Q_MAX declared for one test, then taken out of the table again."""
    register(Q_MAX)
    try:
        yield Q_MAX
    finally:
        FEATURES.pop(Q_MAX.name)


# a dense test feature of its own width, recorded by the harvest: the draft's two largest
# warped probabilities at the position, declared by this one entry
TOP2 = Feature(
    "q_top2",
    "the two largest q_t(v), the draft's confidence and its runner-up",
    from_records=lambda records, settings: records.array("q_top2"),
    at_decode=lambda inputs, settings: inputs.step.head_q.topk(2, -1).values,
    array=Array(
        "two",
        width_of=lambda models: 2,
        at_position=lambda at: at.q.topk(2, -1).values,
        note="the two largest q_t(v)",
    ),
    pre_draw=True,
)


@pytest.fixture
def q_top2() -> Iterator[Feature]:
    """TOP2 declared for one test, then taken out of the table again."""
    register(TOP2)
    try:
        yield TOP2
    finally:
        FEATURES.pop(TOP2.name)


def test_the_built_in_table_gives_the_record_schema_of_design_md() -> None:
    """The schema's columns (schema version 2) are the base ones, then the features' own."""
    assert [c.name for c in feature_columns()] == [
        "draft_margin",
        "draft_entropy_raw",
        "run_position",
        "accepted_before",
        "drafts_before",
        "target_margin",
    ]
    schema = record_schema()
    assert schema.names == [name for name, _ in BASE_COLUMNS] + [c.name for c in feature_columns()]
    assert schema.field("run_position").type == pa.int32()
    assert schema.field("accepted_before").type == pa.float32()
    assert feature_order()[:3] == ("hidden", "token_embedding", "target_hidden")
    assert history_features() == {"run_position", "accept_so_far", "target_hidden", "target_margin"}
    assert pre_draw_features() == {"hidden", "draft_entropy"}


def test_a_registered_feature_joins_every_reader_and_leaves_with_its_fixture(q_max) -> None:
    assert feature_order()[-1] == "q_max" and "q_max" in record_schema().names
    spec = FeatureSpec.from_names(["q_max", "hidden"])
    assert spec.names == ("hidden", "q_max") and spec.record_columns() == ["q_max"]
    assert spec.layout(4) == [{"name": "hidden", "width": 4}, {"name": "q_max", "width": 1}]
    assert scores_before_the_draw(type("V", (), {"spec": spec})())
    table = pa.table({"q_max": pa.array([0.5, 1.5, np.inf, np.nan], pa.float32())})
    assert out_of_range(table) == {"q_max": 3}  # above 1, not finite, NaN


def test_the_built_in_arrays_are_the_draft_and_target_states() -> None:
    assert list(recorded_arrays()) == ["hidden", "target_hidden"] == list(array_kinds())
    assert FEATURES["hidden"].width == "hidden" and FEATURES["token_embedding"].width == "embedding"
    assert list(shard_files(Path("r"), "shard-000000")) == [
        "records",
        "hidden",
        "target_hidden",
        "sequences",
    ]


def test_a_registered_dense_feature_is_harvested_written_and_read(q_top2, tmp_path) -> None:
    """One declaration of a width-2 array gives its shard file, hash, manifest section,
    harvested array, reader width, vector layout and training features."""
    assert array_kinds() == ("hidden", "target_hidden", "q_top2")
    files = shard_files(tmp_path, "shard-000000")
    assert files["q_top2"] == tmp_path / "shard-000000.q_top2.npy"
    assert sha256_keys()["q_top2"] == b"sprinter.q_top2_sha256"
    assert feature_order()[:4] == ("hidden", "token_embedding", "target_hidden", "q_top2")

    models = generating_models("llama", None)
    assert model_widths(models)["q_top2"] == 2
    ids = torch.randint(0, 128, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    prompt = Prompt("toy-0", "toy", "test", "", ids[:4], None)
    flags = (False,) * 4 + (True, True, False, True, True, True, False, True)
    sequence = HarvestSequence(prompt, "interleaved", ids, 4, 12, flags)
    batch = harvest_batch(models, [sequence], SamplingConfig(), -1, 0, torch.device("cpu"))
    top2 = batch.arrays["q_top2"]
    assert top2.shape == (8, 2) and top2.dtype == np.float16
    assert (top2[:, 0] >= top2[:, 1]).all() and (top2[:, 0] >= batch.columns["q"] - 1e-3).all()

    records_dir = tmp_path / "exp" / "records"
    records_dir.mkdir(parents=True)
    plan = ShardPlan(0, (prompt,), ("interleaved",))
    write_shard(records_dir, plan, batch, [sequence], "declared")
    sections = array_sections({"hidden_layer": -1}, model_widths(models))
    assert sections["q_top2"]["d"] == 2 and "q_top2.npy" in sections["q_top2"]["file"]
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "experiment": "exp",
        **sections,
        "shards": [{"name": plan.name, "rows": batch.rows}],
    }
    write_json(records_dir / "manifest.json", manifest)
    assert array_widths(manifest)["q_top2"] == 2
    records = open_records(tmp_path / "exp")
    assert records.widths["q_top2"] == 2
    assert np.array_equal(records.hidden(np.arange(8), "q_top2"), top2)
    spec = FeatureSpec.from_names(["q", "q_top2"])
    assert spec.arrays == ("q_top2",)
    assert spec.layout_of(records.widths) == [
        {"name": "q_top2", "width": 2},
        {"name": "q", "width": 1},
    ]
    features = rows_features(records, np.arange(8), spec)
    assert features.dim == 3
    assert torch.equal(features.dense, torch.from_numpy(top2))


def test_the_table_refuses_a_feature_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="already declared"):
        register(FEATURES["q"])
    taken = Feature(
        "other", "", Q_MAX.from_records, Q_MAX.at_decode, FEATURES["draft_margin"].columns
    )
    with pytest.raises(ValueError, match="'draft_margin' is already declared"):
        register(taken)
    no_recipe = Feature("other", "", Q_MAX.from_records, Q_MAX.at_decode, (Column("x", ""),))
    with pytest.raises(ValueError, match="needs one recipe"):
        register(no_recipe)
    unknown_width = Feature("other", "", Q_MAX.from_records, Q_MAX.at_decode, width="vocab")
    with pytest.raises(ValueError, match="width is one of"):
        register(unknown_width)
    assert "other" not in FEATURES


TINY = (
    *TINY_CHAIN,
    "bench.num_prompts=2",
    "bench.max_new_tokens=8",
    "bench.latency.reps=2",
    "bench.batch_sizes=[1]",
    "bench.judge.enabled=false",
    "train.features=[hidden,q,q_max]",
    "train.lam=1.2",  # methods.sprinter's verifier
    "evaluate.lams=[1.2]",
    "evaluate.ablation.enabled=true",
    "evaluate.bootstrap.resamples=50",
    "experiment=declared",
)


@pytest.mark.heavy  # a stage chain: make test, not test-quick
def test_a_feature_declared_in_a_test_runs_through_every_stage(tmp_path: Path, q_max) -> None:
    """harvest -> train -> tables -> evaluate -> bench with the test's feature among the
    verifier's inputs."""
    roots = (f"artifacts_root={tmp_path / 'artifacts'}", f"checkpoints_root={tmp_path / 'ck'}")
    DECODED.clear()
    for stage in ("harvest", "train", "tables", "evaluate"):
        run_stage(compose_config(*roots, *TINY, f"stage={stage}"))
    exp = tmp_path / "artifacts" / "declared"
    records = open_records(exp)
    frame = records.frame
    assert records.manifest["columns"]["q_max"] == "float"
    assert (frame["q_max"] >= frame["q"] - 1e-6).all() and (frame["q_max"] <= 1).all()
    checkpoint = load_verifier(verifier_path(tmp_path / "ck" / "declared", 1.2))
    assert checkpoint.spec.names == ("hidden", "q", "q_max")
    report = read_json(exp / "eval" / "report.json")
    assert "verifier_lam1.2" in report["auc"]
    assert "q_max" in report["ablation"]["groups"]

    run_stage(compose_config(*roots, *TINY, "stage=bench", "bench.methods=[target_only,sprinter]"))
    bench = read_json(exp / "bench" / "results.json")
    assert set(bench["methods"]) == {"target_only", "sprinter"} and not bench["skipped"]
    assert bench["methods"]["sprinter"]["tokens"] > 0
    assert DECODED and all(bool(((v >= 0) & (v <= 1)).all()) for v in DECODED)
