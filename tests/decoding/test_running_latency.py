"""The engine's timings: the latency profile corrected by the run's own forwards, fed by the
engine once a round and read by every policy that shares it."""

from __future__ import annotations

import statistics

import pytest
import torch

from sprinter_train.decoding.builder import build_runner
from sprinter_train.decoding.policies import SpeculativeDecoding, SpecVerification
from sprinter_train.decoding.policies.plans.gamma_plan import GammaPlanner
from sprinter_train.decoding.runner.requests import ForwardRequest
from sprinter_train.decoding.timings import RunningLatency, Timings
from sprinter_train.models.tiny import build_tiny_model
from tests.decoding_helpers import GREEDY, PROMPTS, ATable, engine_for, tiny_trio


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


def test_timings_learn_from_what_they_observe_unless_fixed() -> None:
    timings = Timings(flat, draft=lambda rows: 0.01)
    timings.observe("target", [(4, 2, 0.3), (4, 2, 0.5)])
    timings.observe("draft", [(4, 1, 0.02)])
    assert timings.target(4, 2) == pytest.approx(0.4)
    assert timings.step(4) == pytest.approx(0.02) and timings.step(8) == pytest.approx(0.02)
    fixed = Timings(flat, draft=lambda rows: 0.01, learn=False)
    fixed.observe("target", [(4, 2, 0.3)])
    assert fixed.target(4, 2) == flat(4, 2) and fixed.step(4) == 0.01
    with pytest.raises(ValueError, match="companion's forward has no price"):
        timings.step(4, ("draft", "companion"))
    timings.set_priors(flat, draft=lambda rows: 0.01, companion=lambda rows: 0.03)
    assert timings.target(4, 2) == pytest.approx(0.4)  # what was measured stays
    assert timings.step(4, ("draft", "companion")) == pytest.approx(0.02 + 0.03)


def test_the_runner_reports_each_forward_shape_once() -> None:
    model = build_tiny_model({}, seed=0)
    runner = build_runner(model, int(model.config.vocab_size))
    cache = runner.new_cache(2)
    runner.prime(cache, [[1, 2, 3], [4, 5]])
    assert runner.forward_times() == []  # a prefill is not a verification forward
    for width in (1, 3):
        ids = torch.ones((2, width), dtype=torch.long)
        keep = torch.zeros((2, 1), dtype=torch.long)
        runner.run(cache, ForwardRequest(ids, torch.tensor([width, 1]), keep))
    times = runner.forward_times()
    assert [(rows, width) for rows, width, _ in times] == [(2, 1), (2, 3)]
    assert all(seconds > 0 for _, _, seconds in times) and runner.forward_times() == []


def test_sv_stops_drafting_once_the_run_prices_a_wider_forward() -> None:
    """The profile says a second token a row is free, so one average draft pays; the run
    measured it at twice a one-token forward, and then no draft pays."""
    timings = Timings(flat, draft=lambda b: 0.002, companion=lambda b: 0.0)
    policy = SpecVerification(ATable(), 4)
    assert policy.worth_a_draft(timings, 16)
    timings.observe("target", [(16, 1, 0.066), (16, 2, 0.132)])
    assert not policy.worth_a_draft(timings, 16)


def test_policies_sharing_an_engine_both_see_every_forward() -> None:
    """Two methods on one engine, as in the bench: the engine hands every forward to its
    timings once, so what the second prices with includes the first's forwards (a policy that
    read the runners' queue took them from the others)."""
    models = tiny_trio()
    timings = Timings(flat, draft=lambda rows: 0.002, companion=lambda rows: 0.001)
    engine = engine_for(models, GREEDY, timings)
    planner = GammaPlanner(0.5, 3, margin=0.05, weight=32.0, probe_every=4)
    with timings.recording("target", engine.runners) as target:
        sd = engine.generate(PROMPTS, SpeculativeDecoding(2, planner=planner), 8)[0].stats
        sv = engine.generate(PROMPTS, SpecVerification(ATable(), 4), 8)[0].stats
    assert len(target) == sd.target_calls + sv.target_calls > 0
    assert all(runner.forward_times() == [] for runner in engine.runners.values())
    shapes = {(rows, width) for rows, width, _ in target}
    for rows, width in shapes:  # each shape priced by the median of its latest forwards
        latest = [s for r, w, s in target if (r, w) == (rows, width)][-8:]
        assert timings.target(rows, width) == pytest.approx(statistics.median(latest))
