"""One rule for every reader of fitted artifacts (verifier/fit_check.py, sv/table.py): stage=evaluate refuses a
verifier or SV table fitted on prompts it scores, as the bench and evaluate.transfer do.

Issue 39 item 1: a verifier trained on data.seed=0 records, the experiment harvested again
with data.seed=1, then stage=evaluate: exit 0 and a headline AUC over test prompts one of
which the verifier was trained on, with only a line under "Notes" to say so.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sprinter_train.__main__ import run_stage
from sprinter_train.core.config import compose_config
from sprinter_train.core.io import read_json
from sprinter_train.data.overlap import Reader, TrainOverlapError, fitted_prompts
from sprinter_train.evaluation.inputs import check_fitted, load_inputs
from sprinter_train.sv.table import check_fitted_table
from sprinter_train.verifier.checkpoint import load_verifier, verifier_path
from sprinter_train.verifier.fit_check import VerifierMismatchError, check_fitted_verifier
from tests.chain_helpers import TINY_CHAIN

TRAIN = ("train.lam=1.2", "evaluate.lams=[1.2]", "train.learning_curve=[]")
FAST_EVAL = ("evaluate.ceiling.enabled=false", "evaluate.ablation.enabled=false")


@pytest.fixture(scope="module")
def reharvested(tmp_path_factory) -> dict:
    """Experiment `seed0`: harvest, train λ 1.2 and tables on data.seed=0; experiment `both`:
    the same fitted files beside records harvested with data.seed=1 (what harvesting again
    into the experiment leaves), so its test prompts hold some of the fitted ones."""
    root = tmp_path_factory.mktemp("fitted")
    for stage in ("harvest", "train", "tables"):
        run_stage(compose_at(root, f"stage={stage}", "experiment=seed0", *TRAIN))
    run_stage(compose_at(root, "stage=harvest", "experiment=both", "data.seed=1"))
    artifacts, checkpoints = root / "artifacts", root / "checkpoints"
    shutil.copytree(checkpoints / "seed0", checkpoints / "both")
    shutil.copytree(artifacts / "seed0" / "tables", artifacts / "both" / "tables")
    return {"root": root}


def compose_at(root: Path, *overrides: str):
    return compose_config(
        f"artifacts_root={root / 'artifacts'}",
        f"checkpoints_root={root / 'checkpoints'}",
        *TINY_CHAIN,
        *overrides,
    )


def evaluate_cfg(root: Path, *overrides: str):
    return compose_at(root, "stage=evaluate", "experiment=both", *TRAIN, *FAST_EVAL, *overrides)


@pytest.mark.heavy  # stage chains: make test, not test-quick
def test_evaluate_refuses_a_verifier_trained_on_its_test_prompts(reharvested) -> None:
    root = reharvested["root"]
    with pytest.raises(TrainOverlapError) as error:
        run_stage(evaluate_cfg(root))
    message = str(error.value)
    assert "of stage=evaluate's" in message and "verifier-lam1.2.safetensors" in message
    assert "stage=train experiment=both" in message  # the command that fixes it
    assert "evaluate.allow_train_overlap=true" in message
    assert not (root / "artifacts" / "both" / "eval" / "report.json").exists()


@pytest.mark.heavy
def test_evaluate_refuses_a_table_fitted_on_its_test_prompts(reharvested) -> None:
    """The SV table is read under the same rule: checked alone (the verifier aside), it is
    refused naming the table and stage=tables."""
    cfg = evaluate_cfg(reharvested["root"])
    records, _, table = load_inputs_allowing(cfg)
    assert table is not None
    with pytest.raises(TrainOverlapError, match=r"sv_table\.json.*stage=tables experiment=both"):
        check_fitted(cfg, records, {}, table)


def load_inputs_allowing(cfg):
    """evaluate's inputs loaded with the overlap allowed (so they can be checked one by one)."""
    allowed = cfg.copy()
    allowed.evaluate.allow_train_overlap = True
    return load_inputs(allowed)


@pytest.mark.heavy
def test_allowed_overlap_is_counted_in_the_report(reharvested) -> None:
    root = reharvested["root"]
    run_stage(evaluate_cfg(root, "evaluate.allow_train_overlap=true"))
    report = read_json(root / "artifacts" / "both" / "eval" / "report.json")
    counts = report["inputs"]["verifiers"]["verifier_lam1.2"]["train_overlap"]
    assert counts > 0 and report["inputs"]["sv_table"]["train_overlap"] > 0
    markdown = (root / "artifacts" / "both" / "eval" / "report.md").read_text()
    assert f"({counts} of the scored prompts were among its fitted ones" in markdown


@pytest.mark.heavy
def test_every_reader_applies_the_same_rule(reharvested) -> None:
    """The bench, transfer, evaluate and export readers all refuse through check_verifier /
    check_table: the same prompts and files give the same verdict whoever reads them, and a
    reader that scores no prompts (export) checks only the models."""
    root = reharvested["root"]
    checkpoint = load_verifier(verifier_path(root / "checkpoints" / "seed0", 1.2), "seed0")
    fitted = checkpoint.meta["fitted_prompts"]["id_sha256"]
    cfg = evaluate_cfg(root)
    records, _, table = load_inputs_allowing(cfg)
    scored = [str(p) for p in records.frame["prompt_id"].unique()]
    sampling = records.manifest["sampling"]
    draft = records.manifest["models"]["draft"]
    for who, key in [
        ("the bench", "bench.allow_train_overlap"),
        ("stage=evaluate", "evaluate.allow_train_overlap"),
        ("evaluate.transfer=both", "evaluate.allow_train_overlap"),
    ]:
        reader = Reader(who, scored, False, key, "both")
        with pytest.raises(TrainOverlapError, match=f"of {who}'s .*{key}=true"):
            check_fitted_verifier(checkpoint, reader, draft, sampling, "fix it")
        allowed = Reader(who, scored, True, key, "both")
        count = check_fitted_verifier(checkpoint, allowed, draft, sampling, "fix it")
        assert 0 < count <= len(fitted)
        assert check_fitted_table(table, Path("t.json"), allowed, None, "fix it") > 0
    export = Reader("stage=export", None, False, "", "both")
    assert check_fitted_verifier(checkpoint, export, draft, sampling, "") is None
    other = {**draft, "seed": 99}
    with pytest.raises(VerifierMismatchError, match="seed"):
        check_fitted_verifier(checkpoint, export, other, sampling, "")
    with pytest.raises(VerifierMismatchError, match="records hold layer 5"):
        check_fitted_verifier(
            checkpoint, Reader("stage=evaluate", [], False, "k", "both"), draft, sampling, "", 5
        )


def test_no_overlap_no_refusal() -> None:
    """Prompts the file was not fitted on pass; a file without `fitted_prompts` cannot be
    checked (None), as before."""
    recorded = fitted_prompts(["a", "b"], ["train"])
    from sprinter_train.data.overlap import check_overlap

    assert check_overlap(recorded, ["c", "d"], "v", False, "r") == 0
    assert check_overlap(None, ["a"], "v", False, "r") is None
