"""Entropy / information gain against brute force, SV binning and lookup, stage=tables."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sprinter_train.__main__ import run_stage
from sprinter_train.core.io import read_json
from sprinter_train.harvest.reader import MissingInputError
from sprinter_train.sv.fit import fill_sparse, fit_binning, fit_tables
from sprinter_train.sv.information import discretise, heldout_information, information
from sprinter_train.sv.table import Binning, SVTable, quantile_edges
from tests.synthetic import write_synthetic_records


def brute_information(x: list[int], y: list[int]) -> tuple[float, float, float]:
    """H(X), H(X|Y), I(X;Y) in bits by counting pairs with plain Python."""
    n = len(x)
    px = Counter(x)
    py = Counter(y)
    pxy = Counter(zip(x, y, strict=True))
    h_x = -sum(c / n * math.log2(c / n) for c in px.values())
    h_x_y = -sum(c / n * math.log2(c / py[yy]) for (_, yy), c in pxy.items())
    return h_x, h_x_y, h_x - h_x_y


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_information_agrees_with_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 4, 60)
    y = (x + rng.integers(0, 3, 60)) % 5
    got = information(x, y)
    h_x, h_x_y, i = brute_information(x.tolist(), y.tolist())
    assert got["H_X"] == pytest.approx(h_x)
    assert got["H_X_given_Y"] == pytest.approx(h_x_y)
    assert got["I"] == pytest.approx(i)


def test_information_is_zero_for_independent_variables() -> None:
    rng = np.random.default_rng(3)
    n = 200_000
    x, y = rng.integers(0, 10, n), rng.integers(0, 50, n)
    got = information(x, y)
    bias = (10 - 1) * (50 - 1) / (2 * n * math.log(2))  # the plug-in estimate's expected value
    assert 0 <= got["I"] < 3 * bias
    assert abs(got["I_miller_madow"]) < bias


def test_information_equals_entropy_for_a_deterministic_relation() -> None:
    rng = np.random.default_rng(4)
    y = rng.integers(0, 40, 5000)
    x = (y * 7) % 10  # X is a function of Y
    got = information(x, y)
    assert got["H_X_given_Y"] == pytest.approx(0.0, abs=1e-12)
    assert got["I"] == pytest.approx(got["H_X"])
    assert got["H_X"] == pytest.approx(brute_information(x.tolist(), y.tolist())[0])


def test_heldout_information_rewards_real_signal_and_punishes_overfitting() -> None:
    rng = np.random.default_rng(5)
    y = rng.integers(0, 20, 4000)
    x = np.where(rng.random(4000) < 0.8, y % 10, rng.integers(0, 10, 4000))
    assert heldout_information(x[:3000], y[:3000], x[3000:], y[3000:], 10)["I_heldout"] > 1.0
    noise = rng.integers(0, 10, 400)
    many = rng.integers(0, 300, 400)
    assert information(noise[:200], many[:200])["I"] > 1.0  # plug-in: looks informative
    assert (
        heldout_information(noise[:200], many[:200], noise[200:], many[200:], 10)["I_heldout"] < 0
    )


def test_discretise_closes_the_last_bin() -> None:
    assert discretise(np.array([0.0, 0.05, 0.1, 0.95, 1.0]), 10).tolist() == [0, 0, 1, 9, 9]


def test_binning_assigns_edges_like_a_brute_force_scan() -> None:
    rng = np.random.default_rng(6)
    S = rng.random(300)
    A = np.where(rng.random(300) < 0.4, 1.0, rng.random(300))  # A has mass at 1, as on records
    for binning in (Binning.equal_width(5), Binning.adaptive(S, A, 6, 7)):
        i, j = binning.cells(S, A)
        for s, a, bi, bj in zip(S, A, i, j, strict=True):
            n_s, n_a = binning.shape
            expect_i = max(k for k in range(n_s) if k == 0 or s >= binning.s_edges[k])
            expect_j = max(k for k in range(n_a) if k == 0 or a >= binning.a_edges[k])
            assert (bi, bj) == (expect_i, expect_j)
    adaptive = Binning.adaptive(S, A, 6, 7)
    _, j = adaptive.cells(S, A)
    assert (
        set(j[A == 1.0]) == {adaptive.shape[1] - 1}
        and not (j[A < 1.0] == adaptive.shape[1] - 1).any()
    )
    assert quantile_edges(np.linspace(0, 1, 101), 4).tolist() == pytest.approx(
        [0, 0.25, 0.5, 0.75, 1]
    )


def test_sparse_cells_fall_back_to_neighbours_then_the_global_mean() -> None:
    counts = np.array([[50, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 3]])
    sums = np.array([[10.0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 3.0]])
    value, source = fill_sparse(counts, sums, min_count=20, global_mean=0.5)
    assert value[0, 0] == pytest.approx(0.2) and source[0, 0] == "bin"
    assert value[1, 1] == pytest.approx(0.2) and source[1, 1] == "radius1"
    assert value[2, 2] == pytest.approx(13 / 53) and source[2, 2] == "radius2"
    assert value[3, 3] == pytest.approx(0.5) and source[3, 3] == "global"  # 3 records: too few
    assert not np.isnan(value).any()


def test_table_cells_hold_the_mean_acceptance_of_their_records() -> None:
    rng = np.random.default_rng(7)
    S, A, x = rng.random(2000), rng.random(2000), rng.random(2000)
    entry = fit_binning(Binning.equal_width(4), S, A, x, min_count=1)
    for i, j in itertools.product(range(4), range(4)):
        inside = (np.minimum(S * 4, 3).astype(int) == i) & (np.minimum(A * 4, 3).astype(int) == j)
        assert entry["counts"][i][j] == inside.sum()
        assert entry["p_accept"][i][j] == pytest.approx(x[inside].mean())


@pytest.fixture
def synthetic_experiment(tmp_path: Path) -> Path:
    exp = tmp_path / "artifacts" / "syn"
    write_synthetic_records(exp, rows=8192, d=16, shard_rows=2048)
    return exp


def test_tables_stage_writes_a_table_the_decoder_can_look_up(
    compose_cfg, synthetic_experiment
) -> None:
    cfg = compose_cfg("stage=tables", "experiment=syn")
    result = run_stage(cfg)
    path = Path(cfg.experiment_dir) / "tables" / "sv_table.json"
    payload = read_json(path)
    assert set(payload["binnings"]) == {"5x5", "10x10", "20x20", "adaptive"}
    adaptive = payload["binnings"]["adaptive"]
    assert (
        100 < adaptive["cells"] <= 272
        and result["binnings"]["adaptive"]["cells"] == adaptive["cells"]
    )
    for entry in payload["binnings"].values():
        assert not np.isnan(np.asarray(entry["p_accept"], dtype=float)).any()
        for name in ("X", "binary_sampled", "binary_label"):
            info = entry["entropy_bits"][name]
            assert info["I"] > 0.1 and info["I"] <= info["H_X"] + 1e-9
    assert (Path(cfg.experiment_dir) / "tables" / "sv_table.png").stat().st_size > 0
    table = SVTable.load(path)
    assert table.binning.name == "adaptive"
    # A is min(1, p/q) plus noise in the synthetic records: P(accept) rises with A
    assert table.lookup(0.5, 0.05) < 0.4 < 0.8 < table.lookup(0.5, 1.0)
    assert isinstance(table.lookup(0.5, 0.5), float)
    assert SVTable.load(path, "5x5").p_accept.shape == (5, 5)


def test_tables_need_a_companion_and_records(compose_cfg, synthetic_experiment) -> None:
    manifest_path = synthetic_experiment / "records" / "manifest.json"
    manifest = read_json(manifest_path)
    manifest["companion"] = False
    manifest_path.write_text(__import__("json").dumps(manifest))
    with pytest.raises(ValueError, match="companion"):
        run_stage(compose_cfg("stage=tables", "experiment=syn"))
    with pytest.raises(MissingInputError, match="stage=harvest"):
        run_stage(compose_cfg("stage=tables", "experiment=nothing_here"))
    with pytest.raises(MissingInputError, match="stage=tables"):
        SVTable.load(synthetic_experiment / "tables" / "sv_table.json")


def test_fit_tables_fits_only_the_fit_splits_and_checks_its_default() -> None:
    rng = np.random.default_rng(8)
    n = 600
    frame = pd.DataFrame(
        {
            "split": np.where(np.arange(n) < 400, "train", "test"),
            "S": rng.random(n),
            "A": rng.random(n),
            "accept_prob": rng.random(n),
            "ratio": rng.random(n) * 2,
        }
    )
    frame.loc[400:, "accept_prob"] = 1.0  # test rows would lift every mean if they were used
    tcfg = {
        "grids": [2],
        "adaptive": [3, 3],
        "default": "2x2",
        "min_count": 1,
        "x_bins": 4,
        "fit_splits": ["train"],
        "seed": 0,
    }
    fitted = fit_tables(frame, tcfg)
    train = frame.iloc[:400]
    assert fitted["rows"] == 400
    assert fitted["global_mean_accept"] == pytest.approx(train["accept_prob"].mean())
    assert sum(map(sum, fitted["binnings"]["2x2"]["counts"])) == 400
    assert set(fitted["info_gain_bits"]) == {"2x2", "adaptive"}
    assert fitted["info_gain_bits"]["2x2"] == fitted["binnings"]["2x2"]["entropy_bits"]["X"]["I"]
    with pytest.raises(ValueError, match="no records in splits"):
        fit_tables(frame, {**tcfg, "fit_splits": ["val"]})
    with pytest.raises(ValueError, match="tables.default='9x9' is none of"):
        fit_tables(frame, {**tcfg, "default": "9x9"})


def test_device_table_matches_the_numpy_lookup_and_the_s_marginal() -> None:
    """The decoder's tensor lookup picks the same cells; P(accept | S) is the count-weighted
    row mean, checked against a brute-force average over records in that S bin."""
    import torch

    from sprinter_train.sv.table import Binning, SVTable

    rng = np.random.default_rng(0)
    binning = Binning.equal_width(4)
    S, A = rng.random(5000), rng.random(5000)
    X = np.clip(0.2 + 0.5 * A * S + 0.1 * rng.standard_normal(5000), 0, 1)
    cells = binning.flat(S, A)
    counts = np.bincount(cells, minlength=16).reshape(4, 4)
    means = np.bincount(cells, weights=X, minlength=16).reshape(4, 4) / counts
    table = SVTable(binning, means, counts, {})
    probe_S, probe_A = rng.random(200), rng.random(200)
    device = table.on("cpu")
    got = device.lookup(torch.as_tensor(probe_S), torch.as_tensor(probe_A)).numpy()
    np.testing.assert_allclose(got, table.lookup(probe_S, probe_A))
    rows = binning.cells(S, A)[0]
    for i in range(4):
        expected = X[rows == i].mean()
        value = float(device.lookup_s(torch.tensor([(i + 0.5) / 4], dtype=torch.float64))[0])
        assert value == pytest.approx(expected)


def test_device_table_prior_is_the_count_weighted_mean() -> None:
    from sprinter_train.sv.table import Binning, SVTable

    counts = np.array([[3, 1], [0, 4]])
    p_accept = np.array([[0.2, 0.6], [0.9, 0.5]])
    table = SVTable(Binning.equal_width(2), p_accept, counts, {})
    assert table.on("cpu").prior == pytest.approx((3 * 0.2 + 0.6 + 4 * 0.5) / 8)
