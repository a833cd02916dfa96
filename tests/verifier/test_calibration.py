"""Training labels (ratio | accept_prob) and temperature calibration: the fit recovers known
temperatures, training exports both with their sidecars, and old sidecars still load."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from sprinter_train.__main__ import run_stage
from sprinter_train.core.io import CorruptInputError, read_json
from sprinter_train.core.validation import ConfigError
from sprinter_train.harvest.reader import MissingInputError, open_records
from sprinter_train.stages.schema import schema
from sprinter_train.verifier.calibration import T_MAX, T_MIN, fit_temperature, nll
from sprinter_train.verifier.checkpoint import load_verifier, save_verifier, verifier_path
from sprinter_train.verifier.data import split_features
from sprinter_train.verifier.features import FeatureSpec
from sprinter_train.verifier.labels import LABELS, Label
from tests.synthetic import write_synthetic_records


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def miscalibrated(temperature: float, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Logits z of a model whose true probability is sigmoid(z / T), and labels drawn from it."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 3.0, rows)
    y = (rng.uniform(size=rows) < sigmoid(z / temperature)).astype(np.float32)
    return z.astype(np.float32), y


@pytest.mark.parametrize("true_t", [0.5, 2.0])
def test_the_fit_recovers_the_temperature_of_a_miscalibrated_model(true_t: float) -> None:
    z, y = miscalibrated(true_t, 200_000, seed=int(true_t * 10))
    fit = fit_temperature(z, y)
    assert fit["temperature"] == pytest.approx(true_t, rel=0.03)  # ~7 standard errors
    assert fit["method"] == "temperature" and fit["fitted_on"] == "val"
    assert fit["rows"] == 200_000
    assert fit["nll_before"] == pytest.approx(nll(z, y, 1.0))
    assert fit["nll_after"] == pytest.approx(nll(z, y, fit["temperature"]))
    assert fit["nll_after"] < fit["nll_before"] - 0.01  # a real miscalibration, really fixed
    assert fit["nll_after"] <= nll(z, y, true_t)  # the sample's own minimum


def test_soft_targets_give_the_temperature_exactly() -> None:
    """With targets sigmoid(z / T) themselves (soft BCE), the minimum is T, not an estimate."""
    z = np.linspace(-8, 8, 4001)
    fit = fit_temperature(z, sigmoid(z / 1.7))
    assert fit["temperature"] == pytest.approx(1.7, rel=1e-5)


def test_the_search_finds_the_minimum_of_a_fine_grid() -> None:
    z, y = miscalibrated(1.3, 5_000, seed=3)
    z = z + 0.4  # a biased model as well: only the scale is fitted
    grid = np.exp(np.linspace(math.log(T_MIN), math.log(T_MAX), 20_001))
    losses = np.array([nll(z, y, t) for t in grid])
    fit = fit_temperature(z, y)
    assert fit["nll_after"] <= losses.min() + 1e-9
    assert fit["temperature"] == pytest.approx(grid[losses.argmin()], rel=1e-3)


def test_the_fit_is_deterministic_and_never_raises_the_nll() -> None:
    z, y = miscalibrated(0.8, 3_000, seed=5)
    assert fit_temperature(z, y) == fit_temperature(z.copy(), y.copy())
    flat = fit_temperature(np.zeros(100), np.r_[np.ones(50), np.zeros(50)])
    assert flat["temperature"] == 1.0  # no T helps: T stays 1
    assert flat["nll_after"] == flat["nll_before"] == pytest.approx(math.log(2))
    for seed in range(5):  # whatever the data, the fit does not make val worse
        z, y = miscalibrated(1.0, 64, seed=seed)
        fit = fit_temperature(z, y)
        assert fit["nll_after"] <= fit["nll_before"]
        assert T_MIN <= fit["temperature"] <= T_MAX


def test_the_fit_refuses_mismatched_or_empty_rows() -> None:
    with pytest.raises(ValueError, match="matching non-empty"):
        fit_temperature(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="matching non-empty"):
        fit_temperature(np.zeros(0), np.zeros(0))


def test_labels_name_their_files_and_targets(tmp_path: Path) -> None:
    ratio, accept = Label("ratio", 1.2), Label("accept_prob")
    assert verifier_path(tmp_path, ratio) == verifier_path(tmp_path, 1.2)
    assert verifier_path(tmp_path, 1.2).name == "verifier-lam1.2.safetensors"
    assert verifier_path(tmp_path, accept).name == "verifier-accept.safetensors"
    values = np.array([0.5, 1.2, 1.3, np.inf])
    assert ratio.targets(values).tolist() == [1, 1, 0, 0]
    assert accept.targets(np.array([0.0, 0.25, 1.0])).tolist() == [0.0, 0.25, 1.0]
    assert (ratio.column, accept.column) == ("ratio", "accept_prob")
    with pytest.raises(ValueError, match="accept_prob has no λ"):
        Label("accept_prob", 1.2)
    with pytest.raises(ValueError, match="finite λ > 0"):
        Label("ratio", None)
    with pytest.raises(ValueError, match="choose from"):
        Label("soft")
    label = schema()["train.label"]
    assert not any(label.problems("train.label", kind) for kind in LABELS)  # the check knows them


def export(path: Path, meta: dict, d: int = 6, seed: int = 0) -> Path:
    generator = torch.Generator().manual_seed(seed)
    weight, bias = torch.randn(d, generator=generator), torch.randn(1, generator=generator)
    meta = {"features": {"names": ["hidden"], "d_in": d}, **meta}
    return save_verifier(path, weight, bias, meta)


def test_a_calibrated_sidecar_round_trips(tmp_path: Path) -> None:
    calibration = {"method": "temperature", "temperature": 2.5, "fitted_on": "val"}
    path = export(
        verifier_path(tmp_path, Label("accept_prob")),
        {"label": "accept_prob", "lam": None, "calibration": calibration},
    )
    checkpoint = load_verifier(path)
    assert (checkpoint.label, checkpoint.lam, checkpoint.temperature) == ("accept_prob", None, 2.5)
    x = torch.randn(40, 6, generator=torch.Generator().manual_seed(1)) * 2
    logits = checkpoint.logits(x)
    expected = sigmoid(logits.astype(np.float64) / 2.5)
    np.testing.assert_allclose(checkpoint.calibrated(logits), expected, rtol=1e-6)
    tensor = checkpoint.calibrated(torch.from_numpy(logits))
    assert isinstance(tensor, torch.Tensor)
    np.testing.assert_allclose(tensor.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(checkpoint.calibrated_score(x), expected, rtol=1e-6)
    np.testing.assert_allclose(checkpoint.score(x), sigmoid(logits.astype(np.float64)), rtol=1e-6)
    # calibration moves probabilities but never across 1/2 (SPRINTER's tau)
    assert ((checkpoint.score(x) >= 0.5) == (checkpoint.calibrated_score(x) >= 0.5)).all()


def test_an_old_sidecar_loads_as_ratio_at_temperature_one(tmp_path: Path) -> None:
    checkpoint = load_verifier(export(verifier_path(tmp_path, 1.2), {"lam": 1.2}))
    assert (checkpoint.label, checkpoint.lam, checkpoint.temperature) == ("ratio", 1.2, 1.0)
    x = torch.randn(30, 6, generator=torch.Generator().manual_seed(2))
    assert np.array_equal(checkpoint.calibrated_score(x), checkpoint.score(x))


@pytest.mark.parametrize(
    ("meta", "problem"),
    [
        ({"lam": 1.0, "label": "soft"}, "label 'soft'"),
        ({"lam": None}, "ratio label with lam None"),
        ({"lam": 1.0, "calibration": {"temperature": 0}}, "temperature 0"),
        ({"lam": 1.0, "calibration": {"temperature": -2.0}}, "temperature -2.0"),
        ({"lam": 1.0, "calibration": {"method": "temperature"}}, "temperature None"),
    ],
)
def test_an_unusable_label_or_temperature_names_the_sidecar(tmp_path, meta, problem) -> None:
    path = export(verifier_path(tmp_path, 1.0), meta)
    with pytest.raises(CorruptInputError, match=f"verifier-lam1.json.*{problem}.*stage=train"):
        load_verifier(path)


def test_a_missing_soft_label_verifier_names_its_command(tmp_path: Path) -> None:
    with pytest.raises(MissingInputError, match="stage=train experiment=x train.label=accept_prob"):
        load_verifier(verifier_path(tmp_path, Label("accept_prob")), "x")


@pytest.fixture
def synthetic(tmp_path: Path) -> dict:
    return write_synthetic_records(
        tmp_path / "artifacts" / "syn", rows=12_000, d=24, shard_rows=4096, margin=3.0, noise=0.3
    )


def train(compose_cfg, tmp_path: Path, *overrides: str) -> tuple:
    cfg = compose_cfg(
        "stage=train",
        "experiment=syn",
        f"checkpoints_root={tmp_path / 'checkpoints'}",
        "train=paper",  # the Lightning head on the hidden state, as split_rows builds it
        "train.batch_size=512",
        "train.learning_curve=[]",
        *overrides,
    )
    return cfg, run_stage(cfg)


def split_rows(cfg, split: str, column: str) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """(features, the column's values, global rows) of one split."""
    records = open_records(cfg.experiment_dir)
    features, rows = split_features(records, split, FeatureSpec())
    return features.batch(), records.frame[column].to_numpy()[rows], rows


def best_logistic_fit(x: torch.Tensor, targets: np.ndarray) -> torch.Tensor:
    """The exact minimiser of the soft BCE over w·x + b (Newton's method in float64): the
    best that a linear verifier can do."""
    xb = torch.cat([x.double(), torch.ones(len(x), 1, dtype=torch.float64)], 1)
    y = torch.from_numpy(targets).double()
    w = torch.zeros(xb.shape[1], dtype=torch.float64)
    for _ in range(50):
        p = torch.sigmoid(xb @ w)
        step = torch.linalg.solve((xb * (p * (1 - p))[:, None]).T @ xb, xb.T @ (p - y))
        w -= step
        if float(step.abs().max()) < 1e-10:
            return w
    raise AssertionError("Newton's method did not converge")


@pytest.mark.heavy  # stage=train whole: make test, not test-quick
def test_the_soft_label_verifier_learns_the_expected_acceptance(
    compose_cfg, tmp_path, synthetic
) -> None:
    """sigmoid(w·s + b) fitted to min(1, p/q) estimates E[min(1, p/q) | s]: on average, and as
    well as a linear verifier can (the exact soft-BCE minimiser on the same train rows). The
    planted E[min(1, p/q) | h] has a kink a sigmoid cannot follow, so no closer match exists."""
    cfg, result = train(compose_cfg, tmp_path, "train.label=accept_prob", "train.lam=1.5")
    assert set(result) == {"verifier_accept"}  # one verifier, whatever λ says
    path = verifier_path(cfg.checkpoint_dir, Label("accept_prob"))
    assert result["verifier_accept"]["checkpoint"] == str(path)
    checkpoint = load_verifier(path)
    meta = checkpoint.meta
    assert (checkpoint.label, checkpoint.lam) == ("accept_prob", None)
    assert "train.lam" in meta["label_note"] and "not used" in meta["label_note"]
    assert "auc_label_lam" not in meta["metrics"]["test"]
    assert read_json(Path(cfg.experiment_dir) / "train" / "accept" / "summary.json")["lam"] is None
    features, accept, _ = split_rows(cfg, "test", "accept_prob")
    score = checkpoint.calibrated_score(features)
    assert abs(score.mean() - accept.mean()) < 0.01
    assert meta["metrics"]["test"]["mean_score_calibrated"] == pytest.approx(score.mean(), abs=1e-6)
    assert meta["metrics"]["test"]["mean_label"] == pytest.approx(accept.mean(), abs=1e-6)
    train_x, train_accept, _ = split_rows(cfg, "train", "accept_prob")
    w = best_logistic_fit(train_x, train_accept)
    best = torch.sigmoid(features.double() @ w[:-1] + w[-1]).numpy()
    assert np.abs(score - best).mean() < 0.01 and np.abs(score - best).max() < 0.05
    best_bce = nll(np.log(best) - np.log1p(-best), accept)
    assert nll(checkpoint.logits(features), accept, checkpoint.temperature) < best_bce + 0.002
    # a hard label at λ = 1 learns P(q <= p), not the acceptance probability
    train(compose_cfg, tmp_path, "train.lam=1")
    hard = load_verifier(verifier_path(cfg.checkpoint_dir, 1.0))
    assert abs(hard.calibrated_score(features).mean() - accept.mean()) > 0.05
    assert nll(hard.logits(features), accept, hard.temperature) > best_bce + 0.02


@pytest.mark.parametrize("label", ["ratio", "accept_prob"])
def test_the_sidecars_calibration_is_the_val_nll_of_the_exported_weights(
    compose_cfg, tmp_path, synthetic, label
) -> None:
    cfg, result = train(compose_cfg, tmp_path, f"train.label={label}", "train.lam=1.2")
    name = "verifier_lam1.2" if label == "ratio" else "verifier_accept"
    checkpoint = load_verifier(result[name]["checkpoint"])
    assert checkpoint.label == label
    calibration = checkpoint.meta["calibration"]
    assert calibration == result[name]["calibration"]
    assert set(calibration) >= {"method", "temperature", "fitted_on", "nll_before", "nll_after"}
    kind = Label("ratio", 1.2) if label == "ratio" else Label("accept_prob")
    features, values, rows = split_rows(cfg, "val", kind.column)
    targets = kind.targets(values)
    logits = checkpoint.logits(features)
    assert calibration["rows"] == len(rows)
    assert calibration["nll_before"] == pytest.approx(nll(logits, targets), rel=1e-6)
    t = checkpoint.temperature
    assert calibration["nll_after"] == pytest.approx(nll(logits, targets, t), rel=1e-6)
    assert calibration["nll_after"] <= calibration["nll_before"]
    assert t != 1.0  # early stopping leaves these verifiers measurably off: T does something
    test = checkpoint.meta["metrics"]["test"]
    assert test["bce_calibrated"] != test["bce"]


def test_an_unknown_label_is_refused_before_anything_runs(compose_cfg, tmp_path) -> None:
    with pytest.raises(
        ConfigError, match="train.label='soft' is out of range: .*ratio.*accept_prob"
    ):
        train(compose_cfg, tmp_path, "train.label=soft")
    assert not (tmp_path / "checkpoints").exists()


def test_stage_all_checks_its_labels_first(compose_cfg) -> None:
    for labels, problem in (
        ("[soft]", r"\[0\]='soft' is out of range: one of ratio, accept_prob"),
        ("[]", r"=\[\] is out of range: a non-empty list"),
        ("[ratio,ratio]", " names ratio more than once"),
    ):
        with pytest.raises(ValueError, match=f"train.all_labels{problem}"):
            run_stage(
                compose_cfg("stage=all", "all_steps=[harvest,train]", f"train.all_labels={labels}")
            )
