"""train.select (verifier/select.py): the kept verifier cannot lose to its own inputs, its
choice is recorded, and the chosen head loads and scores through the decoder's path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sprinter_train.__main__ import run_stage
from sprinter_train.core.classification import auc
from sprinter_train.harvest.reader import open_records
from sprinter_train.verifier.checkpoint import load_verifier, verifier_path
from sprinter_train.verifier.data import split_features
from sprinter_train.verifier.select import Candidate, choose, fit_logistic

FEATURES = "train.features=[hidden,q,draft_entropy,draft_margin,draft_entropy_raw]"
# every decode-time group the synthetic records hold (the default's token_embedding needs
# the harvest's draft, which synthetic records have none of)
DECODE_TIME = (
    "train.features=[hidden,q,draft_entropy,draft_margin,draft_entropy_raw,run_position,"
    "accept_so_far]"
)


def entropy_decides(cols: dict[str, np.ndarray], rng: np.random.Generator) -> None:
    """The raw entropy ranks the label almost alone: it grows with -log min(1, p/q)."""
    surprise = -np.log(np.maximum(cols["accept_prob"], 1e-6))
    cols["draft_entropy_raw"] = np.abs(surprise + 0.05 * rng.standard_normal(len(surprise)))


def train_cfg(compose_cfg, tmp_path: Path, *overrides: str, features: str | None = FEATURES):
    return compose_cfg(
        "stage=train",
        "experiment=syn",
        f"checkpoints_root={tmp_path / 'checkpoints'}",
        "train.lam=1",
        "train.learning_curve=[]",
        *([features] if features else []),
        *overrides,
    )


def test_one_feature_alone_separates_and_the_hidden_state_is_noise(compose_cfg, tmp_path) -> None:
    """Issue 38's acceptance: the selected predictor's test AUC is within 0.01 of the one
    feature's, where 256 noise dimensions over 1.6k train rows pull the unregularised
    Lightning head (the `full` candidate) well below it."""
    from tests.synthetic import write_synthetic_records

    write_synthetic_records(
        tmp_path / "artifacts" / "syn",
        rows=2000,
        d=256,
        margin=0.0,
        noise=1.0,
        edit=entropy_decides,
    )
    cfg = train_cfg(compose_cfg, tmp_path)
    result = run_stage(cfg)["verifier_lam1"]
    records = open_records(cfg.experiment_dir)
    test = records.rows_of("test")
    label = records.frame["ratio"].to_numpy()[test] <= 1.0
    feature_auc = auc(label, -records.frame["draft_entropy_raw"].to_numpy()[test])
    assert feature_auc > 0.9  # the feature does separate the labels
    assert result["test"]["auc_q_le_p"] >= feature_auc - 0.01
    selection = load_verifier(verifier_path(cfg.checkpoint_dir, 1.0)).meta["selection"]
    assert selection["chosen"] == result["selected"]
    assert set(selection["candidates"]) == {"scalars", "ridge", "full"}
    for entry in selection["candidates"].values():
        assert 0.0 <= entry["val_auc_q_le_p"] <= 1.0
    chosen = selection["candidates"][selection["chosen"]]
    best = max(e["val_auc_q_le_p"] for e in selection["candidates"].values())
    assert chosen["val_auc_q_le_p"] >= best - selection["tie"]
    assert set(chosen) >= {"test_auc_q_le_p", "seconds"}
    assert selection["candidates"]["full"]["test_auc_q_le_p"] < feature_auc - 0.01  # the premise
    assert np.isclose(chosen["test_auc_q_le_p"], result["test"]["auc_q_le_p"])


def test_the_scalar_head_is_a_linear_checkpoint_with_zero_hidden_weights(
    compose_cfg, tmp_path
) -> None:
    """Forced to the scalar head (a tie as wide as the AUC scale), the checkpoint is the
    usual Linear over the whole layout: hidden weights 0, standardisation folded in, and its
    logits are the ones the selection scored."""
    from tests.synthetic import write_synthetic_records

    write_synthetic_records(
        tmp_path / "artifacts" / "syn", rows=2048, d=16, margin=0.0, noise=1.0, edit=entropy_decides
    )
    cfg = train_cfg(compose_cfg, tmp_path, "train.select.tie=1.0")
    result = run_stage(cfg)["verifier_lam1"]
    assert result["selected"] == "scalars"
    checkpoint = load_verifier(verifier_path(cfg.checkpoint_dir, 1.0))
    weight = checkpoint.model.linear.weight.detach()[0]
    assert weight.shape == (16 + 4,) and checkpoint.meta["features"]["d_in"] == 20
    assert torch.all(weight[:16] == 0) and torch.all(weight[16:] != 0)
    records = open_records(cfg.experiment_dir)
    features, rows = split_features(records, "test", checkpoint.spec)
    label = records.frame["ratio"].to_numpy()[rows] <= 1.0
    scored = checkpoint.calibrated_score(features.batch())
    recorded = checkpoint.meta["selection"]["candidates"]["scalars"]["test_auc_q_le_p"]
    assert np.isclose(auc(label, scored), recorded)


def test_the_paper_configuration_keeps_the_lightning_head(compose_cfg, tmp_path) -> None:
    from tests.synthetic import write_synthetic_records

    write_synthetic_records(tmp_path / "artifacts" / "syn", rows=2048, d=16)
    cfg = train_cfg(compose_cfg, tmp_path, "train=paper", features=None)
    assert list(cfg.train.features) == ["hidden"] and not cfg.train.select.enabled
    result = run_stage(cfg)["verifier_lam1"]
    meta = load_verifier(verifier_path(cfg.checkpoint_dir, 1.0)).meta
    assert meta["selection"] is None and "selected" not in result
    assert meta["features"]["names"] == ["hidden"] and meta["train_config"]["weight_decay"] == 0


def test_the_simplest_candidate_within_the_tie_wins() -> None:
    def make(name: str, val: float) -> Candidate:
        return Candidate(name, torch.zeros(1), torch.zeros(1), val_auc=val)

    family = [make("full", 0.80), make("ridge", 0.799), make("scalars", 0.70)]
    assert choose(family, 0.002).name == "ridge"
    assert choose(family, 0.0).name == "full"
    assert choose(family, 0.2).name == "scalars"


def val_never_sure(cols: dict[str, np.ndarray], rng: np.random.Generator) -> None:
    """Every val row has q/p in (1.05, 3): q/p <= 1 is one class on val, q/p <= 1.5 is not
    (write_synthetic_records' prompts: synthetic-<row // 32>, split with seed 0)."""
    from sprinter_train.data.split import split_of

    n = len(cols["q"])
    val = np.array([split_of(f"synthetic-{i // 32}", 0) == "val" for i in range(n)])
    ratio = rng.uniform(1.05, 3.0, n)
    p = cols["q"] / ratio
    cols["ratio"] = np.where(val, ratio, cols["ratio"])
    cols["p"] = np.where(val, p, cols["p"])
    cols["accept_prob"] = np.where(val, np.minimum(1.0, p / cols["q"]), cols["accept_prob"])


def test_a_val_split_of_one_class_is_refused_before_any_fit(compose_cfg, tmp_path) -> None:
    """Issue 52, item 3: with one class of q/p <= 1 on val every candidate's val AUC was null,
    `scalars` was kept by list order and T ran to its bound, exit 0. Now nothing is fitted or
    written, and the message names the cause and what to change; selection off is a way out
    where the label itself has both classes on val (λ = 1.5), not where it has one (λ = 1).
    A temperature that still runs to its bound is written down in the sidecar."""
    from tests.synthetic import write_synthetic_records

    write_synthetic_records(tmp_path / "artifacts" / "syn", rows=2048, d=16, edit=val_never_sure)
    cfg = train_cfg(compose_cfg, tmp_path, "train.lam=1.5")
    with pytest.raises(ValueError, match="no evidence for train.select") as refused:
        run_stage(cfg)
    message = str(refused.value)
    assert "every val label is negative" in message and "data.num_prompts" in message
    assert "train.select.enabled=false" in message
    assert not list(Path(cfg.checkpoint_dir).glob("verifier-*"))
    off = ("train.select.enabled=false",)
    with pytest.raises(ValueError, match="no evidence for the calibration temperature"):
        run_stage(train_cfg(compose_cfg, tmp_path, "train.lam=1", *off))
    assert not list(Path(cfg.checkpoint_dir).glob("verifier-*"))
    # both classes of q/p <= 1.5 on val, but none of the planted signal: T runs to its bound,
    # which the sidecar says
    run_stage(train_cfg(compose_cfg, tmp_path, "train.lam=1.5", *off))
    calibration = load_verifier(verifier_path(cfg.checkpoint_dir, 1.5)).meta["calibration"]
    assert calibration["temperature"] > 99
    assert calibration["warning"].startswith("T stopped at its upper bound 100")


def test_no_val_auc_leaves_nothing_to_choose_on() -> None:
    family = [Candidate(n, torch.zeros(1), torch.zeros(1)) for n in ("full", "ridge", "scalars")]
    with pytest.raises(ValueError, match="no candidate .* has a val AUC"):
        choose(family, 0.002)


def test_the_lbfgs_fit_matches_sklearn_and_holds_frozen_columns_at_zero() -> None:
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2000, 5))
    y = (rng.random(2000) < 1 / (1 + np.exp(-(x @ [1.0, -2.0, 0.5, 0.0, 0.0] + 0.3)))).astype(float)
    l2 = 0.01
    w, b = fit_logistic(
        torch.from_numpy(x).float(), torch.from_numpy(y).float(), torch.full((5,), l2)
    )
    # sklearn minimises 0.5 |w|^2 + C sum BCE: the same optimum at C = 1 / (n l2)
    reference = LogisticRegression(C=1 / (len(y) * l2), tol=1e-10, max_iter=1000).fit(x, y)
    assert np.allclose(w.numpy(), reference.coef_[0], atol=1e-3)
    assert np.isclose(float(b[0]), reference.intercept_[0], atol=1e-3)
    frozen = torch.tensor([0.01, float("inf"), 0.01, 0.01, 0.01])
    w, _ = fit_logistic(torch.from_numpy(x).float(), torch.from_numpy(y).float(), frozen)
    assert w[1] == 0 and abs(float(w[0])) > 0.5


@pytest.mark.parametrize("label", ["accept_prob"])
def test_the_soft_label_is_selected_too(compose_cfg, tmp_path, label) -> None:
    from tests.synthetic import write_synthetic_records

    write_synthetic_records(tmp_path / "artifacts" / "syn", rows=2048, d=16)
    cfg = train_cfg(compose_cfg, tmp_path, f"train.label={label}")
    result = run_stage(cfg)["verifier_accept"]
    assert result["selection"]["chosen"] in {"scalars", "ridge", "full"}
    assert result["test"]["auc_q_le_p"] > 0.8  # the planted hidden direction is found


def test_evaluate_sets_each_verifier_against_its_inputs_and_shows_the_selection(
    compose_cfg, tmp_path
) -> None:
    """The report scores every scalar input alone (signed on val) beside the hand rules, each
    verifier minus each of them with a paired interval, and the sidecar's selection."""
    from sprinter_train.core.io import read_json
    from tests.synthetic import write_synthetic_records

    exp = tmp_path / "artifacts" / "syn"
    write_synthetic_records(exp, rows=2048, d=16, margin=0.0, noise=1.0, edit=entropy_decides)
    quick = ("evaluate.ceiling.enabled=false", "evaluate.ablation.enabled=false")
    for stage in ("train", "tables", "evaluate"):
        run_stage(train_cfg(compose_cfg, tmp_path, f"stage={stage}", "evaluate.lams=[1]", *quick))
    report = read_json(exp / "eval" / "report.json")
    entry = report["beats_inputs"]
    rivals = entry["rivals"]
    inputs = {"q", "draft_entropy", "draft_margin", "draft_entropy_raw"}
    assert {f"input:{n}" for n in inputs} <= set(rivals)
    assert {"svip_entropy", "sv_table", "draft_q"} <= set(rivals)
    records = open_records(exp)
    test = records.rows_of("test")
    label = records.frame["ratio"].to_numpy()[test] <= 1.0
    # the entropy ranks acceptance downwards: its sign is flipped on val, not on test
    entropy = -records.frame["draft_entropy_raw"].to_numpy()[test]
    assert rivals["input:draft_entropy_raw"]["auc"] == pytest.approx(auc(label, entropy))
    assert entry["best_rival"] == max(rivals, key=lambda n: rivals[n]["auc"] or 0.0)
    diff = entry["versus"]["verifier_lam1"]["input:draft_entropy_raw"]
    verifier_auc = report["auc"]["verifier_lam1"]
    assert diff["value"] == pytest.approx(verifier_auc - auc(label, entropy))
    assert diff["ci"][0] <= diff["value"] <= diff["ci"][1]
    assert entry["selection"]["verifier_lam1"]["chosen"] in {"scalars", "ridge", "full"}
    text = (exp / "eval" / "report.md").read_text()
    assert "Does each verifier beat its own inputs?" in text and "**kept**" in text


@pytest.mark.parametrize("tie", ["1.0", "0.0"])
def test_the_kept_head_scores_alike_in_training_and_in_the_decoders_scorer(
    compose_cfg, tmp_path, tie
) -> None:
    """Whichever head is kept (tie 1: the scalar head; tie 0: the best on val), the decoder's
    CheckpointVerifier reads the file and scores drafted tokens as training's features do."""
    from sprinter_train.models.loading import load_model
    from sprinter_train.verifier.scorer import CheckpointVerifier
    from tests.scorer_helpers import DRAFT, D, draft_step, new_batch, write_records
    from tests.synthetic import write_synthetic_records

    write_synthetic_records(tmp_path / "artifacts" / "syn", rows=2048, d=D)
    cfg = train_cfg(compose_cfg, tmp_path, f"train.select.tie={tie}", features=DECODE_TIME)
    result = run_stage(cfg)["verifier_lam1"]
    assert tie == "0.0" or result["selected"] == "scalars"
    checkpoint = load_verifier(verifier_path(cfg.checkpoint_dir, 1.0))
    record = write_records(tmp_path / "toy")
    features, rows = split_features(open_records(tmp_path / "toy"), None, checkpoint.spec)
    trained = checkpoint.calibrated_score(features.batch())  # the scorer's sigmoid(z / T)
    draft = load_model(DRAFT, "draft", torch.device("cpu"), torch.float32).model
    verifier = CheckpointVerifier(checkpoint, draft)
    step = draft_step(record, list(rows))
    decoded = verifier(None, new_batch(record, list(rows)), None, step).numpy()
    assert len(np.unique(trained.round(4))) > 5  # not a constant: a mismatch would show
    np.testing.assert_allclose(decoded, trained, rtol=0, atol=1e-5)
    if result["selected"] == "scalars":  # the hidden state does not move its score
        step.hidden.normal_()
        again = verifier(None, new_batch(record, list(rows)), None, step).numpy()
        np.testing.assert_allclose(again, decoded, rtol=0, atol=1e-6)
