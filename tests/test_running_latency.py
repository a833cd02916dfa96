"""The run's own target forwards correct the latency profile that sv plans with."""

from __future__ import annotations

import pytest
import torch
from decoding_helpers import ATable

from sprinter_train.decoding.latency import RunningLatency, learn
from sprinter_train.decoding.policies import SpecVerification
from sprinter_train.decoding.runner import ModelRunner
from sprinter_train.models.tiny import build_tiny_model


def flat(rows: int, width: int) -> float:
    """A profile that says a forward costs the same at any width (what the CPU profile said)."""
    return 0.050 + 0.001 * rows


def test_unseen_shapes_read_the_profile_and_seen_ones_their_median() -> None:
    latency = RunningLatency(flat, window=3)
    assert latency(8, 2) == pytest.approx(0.058)
    for seconds in (0.2, 0.1, 0.9, 0.1):  # the window keeps the last three
        latency.observe(8, 2, seconds)
    assert latency(8, 2) == pytest.approx(0.1)
    latency.observe(8, 3, 0.0)  # a zero or empty forward says nothing
    latency.observe(0, 3, 0.5)
    assert latency(8, 3) == pytest.approx(0.058 * 0.1 / 0.058)  # scaled as the run's forwards


def test_an_unseen_shape_scales_like_its_width_first() -> None:
    latency = RunningLatency(flat)
    latency.observe(8, 1, 0.058)  # width 1 as profiled
    latency.observe(8, 2, 0.116)  # width 2 at twice the profile
    assert latency(16, 2) == pytest.approx(flat(16, 2) * 2.0)  # width 2's ratio
    assert latency(16, 1) == pytest.approx(flat(16, 1))
    # width 5 never ran: the median over every width seen (1 and 2) scales the profile
    assert latency(16, 5) == pytest.approx(flat(16, 5) * 1.5)


def test_learn_feeds_a_learning_latency_and_ignores_a_fixed_one() -> None:
    latency = RunningLatency(flat)
    learn(latency, [(4, 2, 0.3), (4, 2, 0.5)])
    assert latency(4, 2) == pytest.approx(0.4)
    learn(flat, [(4, 2, 0.3)])  # a plain callable has nothing to learn: no error


def test_the_runner_reports_each_forward_shape_once() -> None:
    model = build_tiny_model({}, seed=0)
    runner = ModelRunner(model, int(model.config.vocab_size))
    cache = runner.new_cache(2)
    runner.prime(cache, [[1, 2, 3], [4, 5]])
    assert runner.forward_times() == []  # a prefill is not a verification forward
    for width in (1, 3):
        ids = torch.ones((2, width), dtype=torch.long)
        keep = torch.zeros((2, 1), dtype=torch.long)
        runner.forward(cache, ids, torch.tensor([width, 1]), keep)
    times = runner.forward_times()
    assert [(rows, width) for rows, width, _ in times] == [(2, 1), (2, 3)]
    assert all(seconds > 0 for _, _, seconds in times) and runner.forward_times() == []


def test_sv_stops_drafting_once_the_run_prices_a_wider_forward() -> None:
    """The profile says a second token a row is free, so one average draft pays; the run
    measured it at twice a one-token forward, and then no draft pays."""
    latency = RunningLatency(flat)
    policy = SpecVerification(ATable(), latency, lambda b: 0.002, 4)
    assert policy.worth_a_draft(16)
    latency.observe(16, 1, 0.066)
    latency.observe(16, 2, 0.132)
    assert not policy.worth_a_draft(16)
