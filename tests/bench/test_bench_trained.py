"""The bench runs what was trained (issue 14, item 10): the verifier's hidden layer reaches
the draft's runner, a verifier of another draft or sampling is refused, and alpha is never
taken from records measured under other sampling."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sprinter_train.bench.run.alpha import estimate_alpha
from sprinter_train.bench.run.methods import (
    VerifierMismatchError,
    plan_methods,
    verifier_hidden_layer,
)
from sprinter_train.core.io import read_json, write_json
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.builder import build_engine, build_runner
from sprinter_train.models.tiny import build_tiny_model
from sprinter_train.verifier.checkpoint import save_verifier, verifier_path
from tests.decoding_helpers import PACK_EVERY
from tests.synthetic import write_synthetic_records

SAMPLING = {"temperature": 0.2, "top_k": 0, "top_p": 0.9}  # the shipped conf/config.yaml's
TINY_D = 64


@pytest.fixture(scope="module")
def draft() -> torch.nn.Module:
    return build_tiny_model({}, seed=0)


@pytest.fixture
def bench_cfg(compose_cfg, tmp_path: Path):
    """compose_cfg with verifiers under tmp_path (never the repository's checkpoints/)."""
    return lambda *overrides: compose_cfg(f"checkpoints_root={tmp_path / 'ck'}", *overrides)


def save(cfg, **meta) -> Path:
    full = {"lam": 1.2, "features": {"names": ["hidden"], "d_in": TINY_D}, **meta}
    path = verifier_path(cfg.checkpoint_dir, 1.2)
    return save_verifier(path, torch.ones(TINY_D), torch.zeros(1), full)


def plan(cfg, draft, identity=None):
    return plan_methods(cfg, 2, draft, False, "cpu", draft_identity=identity)


def test_the_drafts_runner_reads_the_layer_the_verifier_was_trained_on(bench_cfg) -> None:
    cfg = bench_cfg("bench.methods=[sd,sprinter]")
    assert verifier_hidden_layer(cfg) == -1  # no verifier yet: the plan skips sprinter
    save(cfg, hidden_layer=2, sampling=SAMPLING)
    assert verifier_hidden_layer(cfg) == 2


def test_a_verifier_of_the_benchs_draft_and_sampling_runs(bench_cfg, draft) -> None:
    cfg = bench_cfg("bench.methods=[sprinter]")
    save(cfg, hidden_layer=-1, sampling=SAMPLING, draft_model="tiny", draft_model_files=None)
    got = plan(cfg, draft, {"id": "tiny", "files": None})
    assert "sprinter" in got.policies and got.settings["sprinter"]["verifier"]["hidden_layer"] == -1


@pytest.mark.parametrize(
    ("meta", "named"),
    [
        ({"sampling": {**SAMPLING, "temperature": 1.0}}, "sampling"),
        ({"sampling": SAMPLING, "draft_model": "another-draft"}, "draft_model"),
    ],
)
def test_a_verifier_of_another_draft_or_sampling_is_refused(bench_cfg, draft, meta, named) -> None:
    cfg = bench_cfg("bench.methods=[sprinter]")
    path = save(cfg, hidden_layer=-1, **meta)
    with pytest.raises(VerifierMismatchError, match=f"{path.name}.*{named}"):
        plan(cfg, draft, {"id": "tiny", "files": None})


def test_alpha_is_not_taken_from_records_of_other_sampling(compose_cfg, draft) -> None:
    cfg = compose_cfg("bench.warmup_runs=1", "bench.max_new_tokens=4", "bench.gamma_max=2")
    write_synthetic_records(Path(cfg.experiment_dir), rows=64, d=8, shard_rows=64)
    manifest_path = Path(cfg.experiment_dir) / "records" / "manifest.json"
    manifest = read_json(manifest_path)
    sampling = SamplingConfig.from_cfg(cfg.sampling)
    engine = build_engine(
        build_runner(draft, 128),
        sampling,
        128,
        draft=build_runner(draft, 128),
        pack_every=PACK_EVERY,
    )
    prompt = Prompt("p", "syn", "test", "", [1, 2, 3], None)

    write_json(manifest_path, {**manifest, "sampling": SAMPLING})
    assert estimate_alpha(engine, prompt, cfg)[1] == "records (64 rows)"
    write_json(manifest_path, {**manifest, "sampling": {**SAMPLING, "temperature": 0.7}})
    alpha, source = estimate_alpha(engine, prompt, cfg)
    assert source.startswith("sd on the warm-up prompt") and "refused" in source
    assert 0.0 <= alpha <= 1.0


def test_alpha_is_not_taken_from_records_of_another_draft(compose_cfg, draft) -> None:
    """A bench with another draft than the records' took the old draft's alpha (it seeds sd's
    gamma and the learned priors) and said `records (N rows)`."""
    cfg = compose_cfg("bench.warmup_runs=1", "bench.max_new_tokens=4", "bench.gamma_max=2")
    write_synthetic_records(Path(cfg.experiment_dir), rows=64, d=8, shard_rows=64)
    manifest_path = Path(cfg.experiment_dir) / "records" / "manifest.json"
    write_json(manifest_path, {**read_json(manifest_path), "sampling": SAMPLING})
    engine = build_engine(
        build_runner(draft, 128),
        SamplingConfig.from_cfg(cfg.sampling),
        128,
        draft=build_runner(draft, 128),
        pack_every=PACK_EVERY,
    )
    prompt = Prompt("p", "syn", "test", "", [1, 2, 3], None)
    recorded = read_json(manifest_path)["models"]["draft"]
    same = estimate_alpha(engine, prompt, cfg, {"draft": recorded})
    assert same[1] == "records (64 rows)"
    alpha, source = estimate_alpha(engine, prompt, cfg, {"draft": {"id": "another draft"}})
    assert source.startswith(
        "sd on the warm-up prompt (records refused: harvested with another model: draft id"
    )
    assert 0.0 <= alpha <= 1.0


@pytest.mark.parametrize("warped", [False, True])
def test_evaluate_states_which_entropy_its_svip_and_adaedl_scores_used(compose_cfg, warped):
    from sprinter_train.evaluation.scores import predictor_descriptions

    flag = str(warped).lower()
    cfg = compose_cfg(
        f"methods.svip.warped_entropy={flag}", f"methods.adaedl.warped_entropy={flag}"
    )
    described = predictor_descriptions(cfg, {})
    for name in ("svip_entropy", "adaedl_bound"):  # the records' H_q that the rule reads
        assert ("draft_entropy (of the warped q)" in described[name]) == warped
        assert ("draft_entropy_raw (of the draft's raw softmax)" in described[name]) != warped


def test_a_bench_on_prompts_the_verifier_was_trained_on_is_refused(bench_cfg, draft) -> None:
    """data.seed=1 against records split with seed 0: most of the bench's "test" prompts were
    in the verifier's train split, and the bench exited 0 without a word (issue 24, item 3)."""
    from sprinter_train.bench.report.header_lines import overlap_warning
    from sprinter_train.data.overlap import TrainOverlapError, fitted_prompts
    from sprinter_train.data.split import split_of

    ids = [f"p{i}" for i in range(400)]
    fitted = [p for p in ids if split_of(p, seed=0) in ("train", "val")]  # the records' split
    bench_ids = [p for p in ids if split_of(p, seed=1) == "test"]  # a bench with data.seed=1
    shared = len(set(bench_ids) & set(fitted))
    assert shared > 0
    meta = {"hidden_layer": -1, "fitted_prompts": fitted_prompts(fitted, ["train", "val"])}
    cfg = bench_cfg("bench.methods=[sprinter]")
    save(cfg, **meta)
    mine = [p for p in ids if split_of(p, seed=0) == "test"]
    assert (
        plan_methods(cfg, 2, draft, False, prompt_ids=mine).settings["sprinter"]["verifier"][
            "train_overlap"
        ]
        == 0
    )
    with pytest.raises(TrainOverlapError, match=f"{shared} of the bench's .*allow_train_overlap"):
        plan_methods(cfg, 2, draft, False, prompt_ids=bench_ids)
    allowed = bench_cfg("bench.methods=[sprinter]", "bench.allow_train_overlap=true")
    got = plan_methods(allowed, 2, draft, False, prompt_ids=bench_ids)
    assert got.settings["sprinter"]["verifier"]["train_overlap"] == shared
    warning = overlap_warning({"settings": got.settings})
    assert warning is not None and f"sprinter's verifier ({shared})" in warning
