"""The latency profile's arithmetic: lookups, extrapolation, round costs and the best gamma."""

from __future__ import annotations

from pathlib import Path

import pytest

from sprinter_train.bench.latency import LatencyProfile, profile_models
from sprinter_train.core.distributions import implied_speedup
from sprinter_train.models.tiny import build_tiny_model


def profile() -> LatencyProfile:
    return LatencyProfile({1: 30.0, 2: 31.0, 3: 33.0, 4: 46.0}, 3.0, 2.0, 128, "cpu", "bfloat16")


def test_round_costs_read_the_profile() -> None:
    p = profile()
    assert p.target_s(3) == pytest.approx(0.033)
    assert p.target_s(6) == pytest.approx((46.0 + 2 * 13.0) / 1e3)  # the last slope, extended
    assert p.sd_round_s(2) == pytest.approx(2 * 0.003 + 0.033)
    assert p.sv_round_s(2) == pytest.approx(2 * 0.005 + 0.033)
    assert p.c == pytest.approx(0.1) and p.verify_cost(3) == pytest.approx(46.0 / 30.0)


def test_best_gamma_maximises_the_implied_speedup() -> None:
    p = profile()
    for alpha in (0.2, 0.6, 0.9):
        best = p.best_gamma(alpha, range(1, 6))
        speedups = {g: implied_speedup(alpha, g, p.c, p.verify_cost(g)) for g in range(1, 6)}
        assert speedups[best] == max(speedups.values())
    assert p.best_gamma(0.9, range(1, 6)) > p.best_gamma(0.2, range(1, 6))


def test_profile_of_tiny_models_round_trips(tmp_path: Path) -> None:
    target, draft = build_tiny_model({}, seed=0), build_tiny_model({"num_hidden_layers": 1}, seed=1)
    import torch

    measured = profile_models(target, draft, None, 3, 2, 16, torch.device("cpu"))
    assert sorted(measured.target_ms) == [1, 2, 3, 4] and measured.companion_ms is None
    assert all(v > 0 for v in measured.target_ms.values()) and measured.draft_ms > 0
    measured.save(tmp_path / "latency.json")
    assert LatencyProfile.load(tmp_path / "latency.json") == measured
