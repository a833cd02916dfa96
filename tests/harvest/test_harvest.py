"""stage=harvest on tiny models: record values, alignment, determinism, resume, DDP, errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from sprinter_train.__main__ import run_stage
from sprinter_train.core.config import compose_config
from sprinter_train.core.distributions import entropy
from sprinter_train.core.io import read_json
from sprinter_train.core.sampling import SamplingConfig, warp_probs
from sprinter_train.data.prompts import Prompt, load_prompts
from sprinter_train.harvest import driver
from sprinter_train.harvest.calibration import accept_setting
from sprinter_train.harvest.continuations import RunLaw, build_sequences, original_sequence
from sprinter_train.harvest.mixes import MIXES, assign_mixes
from sprinter_train.harvest.reader import open_records
from sprinter_train.harvest.records import token_statistics
from sprinter_train.harvest.schema import SEQUENCE_SCHEMA, record_schema
from sprinter_train.harvest.shards import ShardPlan, shard_is_complete
from sprinter_train.models.loading import (
    ModelLoadError,
    TokenizerMismatchError,
    load_model,
    looks_local,
)
from sprinter_train.models.roles import Roles, load_roles
from sprinter_train.stages.settings import config_problems
from tests.harvest_helpers import compose_at, default_runners, generating_models


def load_record_set(cfg) -> tuple[pd.DataFrame, np.ndarray, pd.DataFrame]:
    """Records, hidden states and sequences of every shard the manifest lists, in order."""
    records = open_records(cfg.experiment_dir)
    sequences = pd.concat(
        [
            pq.read_table(records.records_dir / f"{n}.sequences.parquet").to_pandas()
            for n in records.shard_names
        ],
        ignore_index=True,
    )
    return records.frame, records.hidden(np.arange(len(records.frame))), sequences


def plan_of(records_dir: Path, index: int) -> ShardPlan:
    """The plan of a written shard, rebuilt from its sequences file (ids and mixes)."""
    seqs = pq.read_table(records_dir / f"shard-{index:06d}.sequences.parquet").to_pandas()
    prompts = tuple(
        Prompt(r.prompt_id, r.dataset, r.split, "", [], None) for r in seqs.itertuples()
    )
    return ShardPlan(index, prompts, tuple(seqs.mix))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """One uninterrupted single-process harvest that the other tests compare against."""
    cfg = compose_at(tmp_path_factory.mktemp("baseline"))
    result = run_stage(cfg)
    records, hidden, sequences = load_record_set(cfg)
    return {"cfg": cfg, "result": result, "records": records, "hidden": hidden, "seqs": sequences}


def assert_same_records(a: dict | tuple, b: dict | tuple, exact: bool = True) -> None:
    records_a, hidden_a = a[0], a[1]
    records_b, hidden_b = b[0], b[1]
    if exact:
        pd.testing.assert_frame_equal(records_a, records_b)
        np.testing.assert_array_equal(hidden_a, hidden_b)
        return
    keys = ["prompt_id", "dataset", "split", "mix", "position", "token_id"]
    pd.testing.assert_frame_equal(records_a[keys], records_b[keys])
    floats = [c for c in records_a.columns if c not in keys]
    np.testing.assert_allclose(records_a[floats], records_b[floats], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hidden_a.astype(np.float32), hidden_b, rtol=1e-3, atol=1e-3)


def test_records_have_the_documented_columns_and_no_nan(baseline) -> None:
    cfg, records, hidden = baseline["cfg"], baseline["records"], baseline["hidden"]
    records_dir = Path(cfg.experiment_dir) / "records"
    manifest = read_json(records_dir / "manifest.json")
    for shard in manifest["shards"]:
        schema = pq.read_schema(records_dir / f"{shard['name']}.parquet").remove_metadata()
        assert schema.equals(record_schema())
        seq_schema = pq.read_schema(records_dir / f"{shard['name']}.sequences.parquet")
        assert seq_schema.remove_metadata().equals(SEQUENCE_SCHEMA)
        rows = np.load(records_dir / f"{shard['name']}.hidden.npy", mmap_mode="r")
        assert rows.shape == (shard["rows"], 64) and rows.dtype == np.float16
    assert len(records) == hidden.shape[0] == manifest["counts"]["records"] == 8 * 6
    floats = ["q", "p", "ratio", "accept_prob", "beta", "draft_entropy", "target_entropy", "S", "A"]
    assert not records[floats].isna().any().any()  # the tiny pair has a companion: S, A set
    assert np.isfinite(hidden.astype(np.float32)).all()
    assert (records.q > 0).all() and records.accept_prob.between(0, 1).all()
    assert ((records.p == 0) == np.isinf(records.ratio)).all()
    assert records.split.isin(["train", "val", "test"]).all()
    assert manifest["hidden"] == {**manifest["hidden"], "layer": -1, "d": 64, "dtype": "float16"}
    for key in ("models", "tokenizer_hash", "sampling", "seeds", "code_version", "fingerprint"):
        assert manifest[key]
    assert manifest["sampling"] == {"temperature": 0.2, "top_k": 0, "top_p": 0.9}


def test_the_four_mixes_come_in_equal_shares(baseline) -> None:
    records, seqs = baseline["records"], baseline["seqs"]
    per_mix = seqs.mix.value_counts()
    assert set(per_mix.index) == set(MIXES)
    assert (per_mix - len(seqs) / 4).abs().max() <= 1
    assert set(records.mix) == set(MIXES)
    # generated regions are the continuation (6 tokens, unless EOS ends one early)
    lengths = seqs.region_end - seqs.region_start
    assert (lengths <= 6).all() and (lengths > 0).all()
    # each prompt records exactly the positions of its region, in order
    for seq in seqs.itertuples():
        positions = records[records.prompt_id == seq.prompt_id].position.tolist()
        assert positions == list(range(seq.region_start, seq.region_end))
        assert seq.region_end <= len(seq.input_ids)
        if seq.mix != "original":
            assert seq.region_start == len(seq.input_ids) - lengths[seq.Index]


@pytest.mark.parametrize("n", [1, 3, 4, 7, 8, 13, 41])
def test_mix_assignment_stays_within_one_prompt_of_its_quota(n: int) -> None:
    ids = [f"prompt-{i}" for i in range(n)]
    for weights in ({m: 1 for m in MIXES}, {"original": 2, "draft": 1, "target": 1}):
        mixes = assign_mixes(ids, weights, seed=3)
        total = sum(weights.values())
        for k in range(1, n + 1):
            for mix in MIXES:
                quota = weights.get(mix, 0) / total * k
                assert abs(mixes[:k].count(mix) - quota) < 1 + 1e-9
    assert assign_mixes(ids, {m: 1 for m in MIXES}, 3) == assign_mixes(
        ids, {m: 1 for m in MIXES}, 3
    )


def test_random_rows_equal_a_one_sequence_recomputation(baseline) -> None:
    """q, p, S, A, beta, entropies and the hidden row, recomputed with plain model calls."""
    cfg, records, hidden, seqs = (baseline[k] for k in ("cfg", "records", "hidden", "seqs"))
    models = load_roles(cfg.models, torch.device("cpu"), torch.float32)
    sampling = SamplingConfig.from_cfg(cfg.sampling)
    rows = np.random.default_rng(0).choice(len(records), size=12, replace=False)
    for row in rows:
        rec = records.iloc[row]
        seq = seqs[seqs.prompt_id == rec.prompt_id].iloc[0]
        assert seq.region_start <= rec.position < seq.region_end
        prefix = torch.tensor([list(seq.input_ids[: rec.position])])
        with torch.no_grad():
            d_out = models.draft.model(prefix, output_hidden_states=True)
            q = warp_probs(d_out.logits[0, -1], sampling)
            p = warp_probs(models.target.model(prefix).logits[0, -1], sampling)
            c = warp_probs(models.companion.model(prefix).logits[0, -1], sampling)
        x = int(rec.token_id)
        expected = {
            "q": q[x],
            "p": p[x],
            "accept_prob": min(1.0, float(p[x] / q[x])),
            "beta": torch.minimum(p, q).sum(),
            "draft_entropy": entropy(q),
            "target_entropy": entropy(p),
            "S": torch.minimum(q, c).sum(),
            "A": min(1.0, float(c[x] / q[x])),
        }
        for name, value in expected.items():
            assert rec[name] == pytest.approx(float(value), abs=1e-4), name
        assert q[x] > 0
        np.testing.assert_allclose(
            hidden[row].astype(np.float32),
            d_out.hidden_states[-1][0, -1].numpy(),
            rtol=2e-3,
            atol=2e-3,
        )


def test_hidden_layer_option_records_that_layer(tmp_path) -> None:
    cfg = compose_at(tmp_path, "data.num_prompts=2", "harvest.hidden_layer=0")
    run_stage(cfg)
    records, hidden, seqs = load_record_set(cfg)
    models = load_roles(cfg.models, torch.device("cpu"), torch.float32)
    rec = records.iloc[len(records) - 1]
    seq = seqs[seqs.prompt_id == rec.prompt_id].iloc[0]
    with torch.no_grad():
        out = models.draft.model(
            torch.tensor([list(seq.input_ids[: rec.position])]), output_hidden_states=True
        )
    embedding = out.hidden_states[0][0, -1].numpy()
    np.testing.assert_allclose(hidden[-1].astype(np.float32), embedding, rtol=2e-3, atol=2e-3)
    assert not np.allclose(embedding, out.hidden_states[-1][0, -1].numpy(), atol=1e-2)


def manifest_of(cfg) -> dict:
    return read_json(Path(cfg.experiment_dir) / "records" / "manifest.json")


def test_auto_alpha_is_the_mean_beta_of_the_first_prompts_original_sequences(
    baseline, tmp_path
) -> None:
    """harvest.interleaved_accept=auto: mean sum min(p, q) over the original regions of the
    first calibration_prompts prompts, recomputed with plain model calls; recorded in the
    manifest and the fingerprint. A number is used as given."""
    cfg = baseline["cfg"]
    manifest = manifest_of(cfg)
    models = load_roles(cfg.models, torch.device("cpu"), torch.float32)
    sampling = SamplingConfig.from_cfg(cfg.sampling)
    length = int(cfg.harvest.continuation_tokens)
    prompts = load_prompts(cfg.data, models.tokenizer, None, driver.max_context(models, length))
    betas = []
    for prompt in prompts[: int(cfg.harvest.calibration_prompts)]:
        ids, start, end = original_sequence(prompt, models.tokenizer, length)
        with torch.no_grad():
            q = warp_probs(models.draft.model(torch.tensor([ids])).logits[0], sampling)
            p = warp_probs(models.target.model(torch.tensor([ids])).logits[0], sampling)
        betas += torch.minimum(p, q)[start - 1 : end - 1].sum(-1).tolist()
    note = manifest["interleaved"]
    assert note["source"].startswith("auto") and note["max_run"] == 8
    assert note["accept"] == pytest.approx(float(np.mean(betas)), abs=6e-5)
    assert 0 < note["accept"] < 1
    assert manifest["content_settings"]["interleaved_accept"] == note["accept"]
    given = compose_at(tmp_path, "data.num_prompts=4", "harvest.interleaved_accept=0.3")
    run_stage(given)
    other = manifest_of(given)
    assert other["interleaved"]["accept"] == 0.3 and other["interleaved"]["source"].startswith(
        "given"
    )
    assert other["fingerprint"] != manifest["fingerprint"]  # num_prompts is not in it


def test_interleaved_accept_is_auto_or_a_probability() -> None:
    assert accept_setting("auto") is None and accept_setting(0.5) == 0.5
    for bad in (0, 1, 1.5, "often", True):
        with pytest.raises(ValueError, match="interleaved_accept"):
            accept_setting(bad)
    # calibration_prompts' range is declared (stages/schema.py), interleaved_accept's checked
    # by hand as well: both come back from the settings check every stage runs
    cfg = compose_config("harvest.interleaved_accept=2", "harvest.calibration_prompts=0")
    problems = sorted(p for p in config_problems(cfg) if p.startswith("harvest."))
    assert len(problems) == 2
    assert "interleaved_accept" in problems[1] and "calibration_prompts" in problems[0]


def test_same_seed_gives_identical_records_and_another_seed_does_not(baseline, tmp_path) -> None:
    again = compose_at(tmp_path / "again")
    run_stage(again)
    assert_same_records(load_record_set(again), (baseline["records"], baseline["hidden"]))
    other = compose_at(tmp_path / "other", "harvest.seed=1")
    run_stage(other)
    records = load_record_set(other)[0]
    assert len(records) != len(baseline["records"]) or not records.equals(baseline["records"])


class SimulatedCrash(Exception):
    """A process dying mid-harvest (a plain error: run_stage turns a KeyboardInterrupt into
    its own interruption report, which is not what this test is about)."""


def test_interrupted_harvest_resumes_to_the_uninterrupted_records(
    baseline, tmp_path, monkeypatch
) -> None:
    cfg = compose_at(tmp_path)
    real_write = driver.write_shard
    calls = []

    def write_then_crash(*args, **kwargs):
        if calls:
            raise SimulatedCrash("simulated interruption after the first shard")
        calls.append(args[1].name)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(driver, "write_shard", write_then_crash)
    with pytest.raises(SimulatedCrash):
        run_stage(cfg)
    records_dir = Path(cfg.experiment_dir) / "records"
    assert sorted(p.name for p in records_dir.glob("shard-*.parquet")) == [
        "shard-000000.parquet",
        "shard-000000.sequences.parquet",
    ]
    assert not (records_dir / "manifest.json").exists()
    first_mtime = (records_dir / "shard-000000.parquet").stat().st_mtime_ns

    monkeypatch.setattr(driver, "write_shard", real_write)
    result = run_stage(cfg)
    assert (result["shards_skipped"], result["shards_written"]) == (1, 2)
    assert (records_dir / "shard-000000.parquet").stat().st_mtime_ns == first_mtime
    resumed = load_record_set(cfg)
    assert_same_records(resumed, (baseline["records"], baseline["hidden"]))
    # the interleaved sequences too, with the alpha measured again on resume
    pd.testing.assert_frame_equal(resumed[2], baseline["seqs"])
    assert "interleaved" in set(resumed[2].mix)
    assert manifest_of(cfg)["interleaved"] == manifest_of(baseline["cfg"])["interleaved"]


def test_truncated_or_corrupt_shards_are_detected_and_redone(baseline, tmp_path) -> None:
    cfg = compose_at(tmp_path)
    records_dir = Path(cfg.experiment_dir) / "records"
    shutil.copytree(Path(baseline["cfg"].experiment_dir) / "records", records_dir)
    hidden_file = records_dir / "shard-000001.hidden.npy"
    hidden_file.write_bytes(hidden_file.read_bytes()[:-100])  # truncated hidden states
    parquet_file = records_dir / "shard-000002.parquet"
    data = bytearray(parquet_file.read_bytes())
    data[len(data) // 3 : len(data) // 3 + 64] = b"\x00" * 64  # corrupt pages, footer intact
    parquet_file.write_bytes(bytes(data))
    manifest = read_json(records_dir / "manifest.json")
    fingerprint = manifest["fingerprint"]
    dims = {kind: manifest[kind]["d"] for kind in ("hidden", "target_hidden")}
    intact = records_dir / "shard-000000.parquet"
    mtime = intact.stat().st_mtime_ns
    assert shard_is_complete(records_dir, plan_of(records_dir, 0), fingerprint, dims)
    assert not shard_is_complete(records_dir, plan_of(records_dir, 1), fingerprint, dims)
    assert not shard_is_complete(records_dir, plan_of(records_dir, 2), fingerprint, dims)

    result = run_stage(cfg)
    assert (result["shards_skipped"], result["shards_written"]) == (1, 2)
    assert intact.stat().st_mtime_ns == mtime
    assert_same_records(load_record_set(cfg), (baseline["records"], baseline["hidden"]))


@pytest.mark.heavy
def test_two_process_ddp_harvest_gives_the_same_record_set(baseline, tmp_path) -> None:
    cfg = compose_at(tmp_path, "harvest.devices=2", "harvest.strategy=ddp")
    result = run_stage(cfg)
    assert result["world_size"] == 2 and result["shards_written"] == 3
    assert_same_records(
        load_record_set(cfg), (baseline["records"], baseline["hidden"]), exact=False
    )


def test_mismatched_tokenizers_fail_before_any_work(tmp_path, monkeypatch) -> None:
    def no_prompts(*args, **kwargs):
        raise AssertionError("prompts were loaded before the tokenizer check")

    monkeypatch.setattr(driver, "load_prompts", no_prompts)
    cfg = compose_at(tmp_path, "+models.draft.tokenizer.shift=7")
    with pytest.raises(TokenizerMismatchError, match="draft"):
        run_stage(cfg)
    assert not (Path(cfg.experiment_dir) / "records").exists()


def test_a_missing_draft_is_named_with_the_stage_that_makes_it(tmp_path) -> None:
    cfg = compose_at(tmp_path, "models=offline_default", "models.draft.path=/nonexistent/draft")
    with pytest.raises(FileNotFoundError, match="draft model at /nonexistent/draft.*stage=distill"):
        run_stage(cfg)


def test_a_repo_folder_path_is_local_for_the_stage_and_the_loader(tmp_path) -> None:
    """`checkpoints/x` has one slash like a hub id, but its first part is a repo folder: the
    stage and the loader both name it as a missing folder instead of asking the hub."""
    assert not looks_local("openai-community/gpt2") and not looks_local("gpt2")
    assert looks_local("checkpoints/no-such-draft") and looks_local("./draft")
    cfg = compose_at(tmp_path, "models=offline_default", "models.draft.path=checkpoints/no-such")
    with pytest.raises(FileNotFoundError, match="draft model at checkpoints/no-such.*distill"):
        run_stage(cfg)
    with pytest.raises(ModelLoadError, match="no-such does not exist"):
        load_model({"path": "checkpoints/no-such"}, "draft", torch.device("cpu"), torch.float32)


def test_p_zero_gives_an_infinite_ratio_never_nan() -> None:
    q = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    p = torch.tensor([[0.0, 1.0, 0.0], [0.4, 0.6, 0.0]])
    stats = token_statistics(q, p, None, torch.tensor([0, 1]))
    assert stats["ratio"][0] == float("inf") and stats["accept_prob"][0] == 0
    assert stats["ratio"][1] == pytest.approx(0.5) and stats["accept_prob"][1] == 1
    assert stats["beta"].tolist() == pytest.approx([0.5, 0.5])
    assert not any(torch.isnan(v).any() for v in stats.values())
    assert "S" not in stats and "A" not in stats


GENERATED = ("draft", "target", "interleaved", "sd_interleaved")
SEQ_PROMPTS = [
    Prompt(f"p{i}", "toy", "train", "", [1, *range(40 + i, 40 + i + 2 + (5 * i) % 9)], None)
    for i in range(12)
]
SEQ_MIXES = [GENERATED[i % 4] for i in range(12)]
SEQ_SAMPLING = SamplingConfig(temperature=1.0, top_k=40, top_p=0.95)
SEQ_RUNS = RunLaw(accept=0.6, max_run=3)  # interleaved runs often longer than a round


def provenance(
    models: Roles, prompts, mixes, n: int = 8, shared_rows: int = 8
) -> list[tuple[list[int], tuple[bool, ...]]]:
    """Each row's continuation and its from_draft flags over the continuation."""
    runners = default_runners(models)
    built = build_sequences(
        models, prompts, mixes, n, n, 3, SEQ_RUNS, SEQ_SAMPLING, 0, shared_rows, runners=runners
    )
    return [
        (seq.input_ids[seq.region_start : seq.region_end], seq.from_draft[seq.region_start :])
        for seq in built
    ]


def continuations(
    models: Roles, prompts, mixes, n: int = 8, shared_rows: int = 8
) -> list[list[int]]:
    return [ids for ids, _ in provenance(models, prompts, mixes, n, shared_rows)]


@pytest.mark.parametrize("shared_rows", [0, 8])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_batched_continuations_match_one_prompt_at_a_time(family: str, shared_rows: int) -> None:
    """Every generated mix's rows in one engine call, or the target and interleaved rows in
    one shared call (prompts of different lengths, rows that accept different numbers of
    drafts), equal each prompt generated alone."""
    models = generating_models(family, None)
    batched = provenance(models, SEQ_PROMPTS, SEQ_MIXES, shared_rows=shared_rows)
    alone = [
        provenance(models, [prompt], [mix])[0]
        for prompt, mix in zip(SEQ_PROMPTS, SEQ_MIXES, strict=True)
    ]
    assert batched == alone and all(len(ids) == 8 for ids, _ in batched)
    # the mixes really differ: the draft, the target and their interleavings
    assert len({tuple(ids) for ids, _ in batched}) == len(batched)
    # provenance: the draft mix is all draft, the target mix none (empty), both interleavings
    # mix the two models' tokens
    pairs = list(zip(batched, SEQ_MIXES, strict=True))
    flags = {mix: [f for (_, f), m in pairs if m == mix] for mix in GENERATED}
    assert all(f == (True,) * 8 for f in flags["draft"]) and flags["target"] == [()] * 3
    for mix in ("interleaved", "sd_interleaved"):
        assert 0 < sum(map(sum, flags[mix])) < 24, mix


def test_continuations_end_at_the_first_eos() -> None:
    """With an EOS id, a continuation stops right after its first EOS; the other rows and
    the prefix before it are unchanged (rows leaving the batch do not disturb the rest)."""
    free = continuations(generating_models("llama", None), SEQ_PROMPTS, SEQ_MIXES)
    eos = free[1][3]  # a token the target mix's row emits fourth
    cut = continuations(generating_models("llama", eos), SEQ_PROMPTS, SEQ_MIXES)
    assert cut[1] == free[1][: free[1].index(eos) + 1] and len(cut[1]) <= 4
    for row_free, row_cut in zip(free, cut, strict=True):
        end = row_free.index(eos) + 1 if eos in row_free else len(row_free)
        assert row_cut == row_free[:end]
    assert any(len(row) == 8 for row in cut)


@pytest.mark.parametrize(
    "batching",
    [("1", "18", "1", "1", "8"), ("8", "48", "64", "128", "0"), ("2", "48", "3", "5", "8")],
)
def test_records_do_not_depend_on_batching(baseline, tmp_path, batching) -> None:
    """All four mixes, one prompt per batch, per generation call and per statistics block,
    all eight in one with every mix its own call (the baseline shares the target and
    interleaved rows' call), or generation chunks that cut across teacher-forced batches,
    give the baseline's sequences and records exactly (float32)."""
    batch_size, shard_rows, generation, statistics, shared = batching
    cfg = compose_at(
        tmp_path,
        f"harvest.batch_size={batch_size}",
        f"harvest.shard_rows={shard_rows}",
        f"harvest.generation_batch_size={generation}",
        f"harvest.statistics_rows={statistics}",
        f"harvest.shared_generation_rows={shared}",
    )
    run_stage(cfg)
    records, hidden, seqs = load_record_set(cfg)
    assert set(seqs.mix) == set(MIXES)
    pd.testing.assert_frame_equal(seqs, baseline["seqs"])
    assert manifest_of(cfg)["interleaved"] == manifest_of(baseline["cfg"])["interleaved"]
    assert_same_records((records, hidden), (baseline["records"], baseline["hidden"]))


def test_every_shard_generates_on_the_same_runners_in_the_decoding_layout(
    baseline, tmp_path, monkeypatch
) -> None:
    """decoding.static_cache=true: every shard's continuations run on one set of runners (made
    once a harvest), in the static layout, and the records are the baseline's exactly."""
    seen = []
    harvest_prompts = driver.harvest_prompts

    def spy(*args, runners=None, **kwargs):
        seen.append(runners)
        return harvest_prompts(*args, runners=runners, **kwargs)

    monkeypatch.setattr(driver, "harvest_prompts", spy)
    cfg = compose_at(tmp_path, "decoding.static_cache=true")
    run_stage(cfg)
    assert len(seen) == 3 and all(runners is seen[0] for runners in seen)
    assert seen[0].layout["static"] and seen[0].runner("target").layout == "static"
    records, hidden, seqs = load_record_set(cfg)
    pd.testing.assert_frame_equal(seqs, baseline["seqs"])
    assert_same_records((records, hidden), (baseline["records"], baseline["hidden"]))


def test_without_a_companion_s_and_a_are_null(tmp_path) -> None:
    cfg = compose_at(tmp_path, "data.num_prompts=4", "~models.companion")
    run_stage(cfg)
    records = load_record_set(cfg)[0]
    assert records.S.isna().all() and records.A.isna().all()
    others = records.drop(columns=["S", "A"]).select_dtypes("number")
    assert not others.isna().any().any() and len(records) > 0
    manifest = read_json(Path(cfg.experiment_dir) / "records" / "manifest.json")
    assert manifest["nullable"] == ["S", "A"] and "companion" not in manifest["models"]


def test_shared_generation_rows_is_a_whole_number_of_rows() -> None:
    assert [driver.shared_rows_of({"shared_generation_rows": n}) for n in (0, 8)] == [0, 8]
    for bad in (-1, 2.5, True, "8"):
        with pytest.raises(ValueError, match="shared_generation_rows"):
            driver.shared_rows_of({"shared_generation_rows": bad})


def test_the_result_gives_records_per_second_beside_the_teacher_forced_phase(baseline) -> None:
    result = baseline["result"]
    rows = result["records_written"]
    assert rows == len(baseline["records"]) > 0
    generation, forced = result["generation_seconds"], result["teacher_forced_seconds"]
    assert generation > 0 and forced > 0
    assert result["records_per_s"] == pytest.approx(rows / (generation + forced))
    assert result["teacher_forced_records_per_s"] == pytest.approx(rows / forced)
    assert result["all_mix_ratio"] == pytest.approx(forced / (generation + forced))
    # a rerun over complete shards writes nothing and claims no throughput
    again = run_stage(baseline["cfg"])
    assert again["shards_written"] == 0 and "records_per_s" not in again
