"""The learning-curve summary: slope of AUC per doubling of train records, doublings to a bar."""

from __future__ import annotations

import math

import pytest

from sprinter_train.evaluation.learning import (
    auc_per_doubling,
    doublings_to_reach,
    last_doubling_gain,
    summarise,
)


def points(rows: list[int], aucs: list[float]) -> list[dict]:
    return [
        {"train_rows": r, "test_auc_q_le_p": a, "val_auc_q_le_p": a + 0.01}
        for r, a in zip(rows, aucs, strict=True)
    ]


def test_slope_is_auc_per_doubling_on_an_exact_log_line() -> None:
    rows = [1000, 2000, 4000, 8000]
    line = points(rows, [0.6 + 0.02 * math.log2(r / 1000) for r in rows])
    assert auc_per_doubling(line) == pytest.approx(0.02)
    assert last_doubling_gain(line, "test_auc_q_le_p") == pytest.approx(0.02)
    # 0.66 at 8000 rows; 0.80 needs (0.80 - 0.66) / 0.02 = 7 doublings
    assert doublings_to_reach(line, 0.80, "test_auc_q_le_p") == pytest.approx(7.0)


def test_least_squares_through_noisy_points_matches_a_brute_force_fit() -> None:
    rows, aucs = [500, 1000, 4000], [0.61, 0.64, 0.66]
    x = [math.log2(r) for r in rows]
    mx, my = sum(x) / 3, sum(aucs) / 3
    slope = sum((a - mx) * (b - my) for a, b in zip(x, aucs, strict=True)) / sum(
        (a - mx) ** 2 for a in x
    )
    assert auc_per_doubling(points(rows, aucs)) == pytest.approx(slope)


def test_flat_or_reached_curves() -> None:
    flat = points([1000, 2000, 4000], [0.68, 0.7, 0.7])
    assert doublings_to_reach(flat, 0.8, "test_auc_q_le_p") is None
    assert doublings_to_reach(flat, 0.65, "test_auc_q_le_p") == 0.0
    assert auc_per_doubling(points([1000], [0.7])) is None


def test_summary_per_verifier_skips_verifiers_without_a_curve() -> None:
    summary = summarise({"verifier_lam1": points([10, 20], [0.6, 0.7]), "old": None}, 0.8)
    assert list(summary) == ["verifier_lam1"]
    entry = summary["verifier_lam1"]
    assert entry["test_auc_per_doubling"] == pytest.approx(0.1)
    assert entry["val_auc_per_doubling"] == pytest.approx(0.1)
    assert entry["test_auc_last_doubling"] == pytest.approx(0.1)
    assert entry["doublings_to_target_test"] == pytest.approx(1.0)


def test_a_bending_curve_is_judged_by_its_last_doubling() -> None:
    bent = points([5000, 10000, 20000, 40000], [0.71, 0.73, 0.743, 0.744])
    assert auc_per_doubling(bent) > 0.01  # the fit over the whole curve is still steep
    assert last_doubling_gain(bent, "test_auc_q_le_p") == pytest.approx(0.001)
    # the last doubling gained 0.001: below min_slope 0.002, 0.80 is out of reach
    assert doublings_to_reach(bent, 0.80, "test_auc_q_le_p", min_slope=0.002) is None
    # at 4x the rows per step the gain per doubling is half the step's gain
    assert last_doubling_gain(
        points([1000, 4000], [0.6, 0.64]), "test_auc_q_le_p"
    ) == pytest.approx(0.02)
