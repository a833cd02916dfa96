"""bench/profile_check.py and the bench's use of it: a latency profile that disagrees with the
run's own forwards is measured again, and if it still disagrees it chooses no gamma.

The run's forward times are fixed by patching the target runner's `forward_times`, which the
engine's timings read (no test reads the wall clock); the decode itself is real, on tiny
models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sprinter_train.bench import prepare as stage
from sprinter_train.bench.latency import LatencyProfile
from sprinter_train.bench.profile_check import check_profile, disagreement
from sprinter_train.bench.report import profile_warning
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import SpeculativeDecoding, TargetOnly
from sprinter_train.decoding.runner import ModelRunner
from sprinter_train.models.loading import LoadedModel
from sprinter_train.models.roles import Roles
from sprinter_train.models.tiny import build_tiny_model

PROMPT = Prompt("p0", "tiny", "test", "", [5, 6, 7, 8], None)
MS = {1: 30.0, 2: 31.0, 3: 33.0, 4: 46.0}


def profile(scale: float = 1.0) -> LatencyProfile:
    target = {n: ms * scale for n, ms in MS.items()}
    return LatencyProfile(target, 3.0 * scale, None, 128, "cpu", "float32")


def run_times(scale: float) -> list[tuple[int, int, float]]:
    """Batch-1 forwards at widths 1-4 taking `scale` x the profile's, and batch-4 ones the
    check must ignore."""
    one = [(1, n, ms * scale / 1e3) for n, ms in MS.items() for _ in range(3)]
    return one + [(4, 2, 10.0)] * 20


@pytest.mark.parametrize(("scale", "agrees"), [(1.0, True), (1.9, True), (0.55, True)])
def test_disagreement_is_the_median_ratio_folded(scale: float, agrees: bool) -> None:
    check = disagreement(profile(), run_times(scale), limit=2.0)
    assert check.ratio == pytest.approx(scale)
    assert check.factor == pytest.approx(max(scale, 1 / scale))
    assert check.agrees == agrees and check.forwards == 12


@pytest.mark.parametrize("scale", [2.5, 0.3])
def test_a_profile_off_by_more_than_the_limit_disagrees(scale: float) -> None:
    check = disagreement(profile(), run_times(scale), limit=2.0)
    assert not check.agrees and check.as_dict()["agrees"] is False


def test_no_batch_one_forward_is_no_agreement() -> None:
    check = disagreement(profile(), [(4, 2, 0.01)], limit=2.0)
    assert check.factor is None and not check.agrees


@pytest.fixture
def tiny():
    model = build_tiny_model({"num_hidden_layers": 1}, seed=0)
    loaded = LoadedModel("tiny", model, None)
    models = Roles(loaded, loaded, None, 128, None)
    engine = Engine(
        ModelRunner(model, 128), SamplingConfig(temperature=0), draft=ModelRunner(model, 128)
    )
    return models, engine


def test_check_profile_decodes_and_reads_only_its_own_forwards(tiny) -> None:
    _, engine = tiny
    batch = engine.new_batch([[5, 6, 7]], 4, [0])  # a round outside any generation: its
    engine.commit(batch, TargetOnly().round(engine, batch))  # forward waits in the runner
    check = check_profile(engine, profile(), [5, 6, 7, 8], gamma=2, max_new_tokens=8, limit=2.0)
    again = engine.generate([[5, 6, 7, 8]], SpeculativeDecoding(2), 8, [0])[0].stats  # greedy
    assert check.forwards == again.target_calls > 0  # every target forward of the decode, only


@pytest.mark.parametrize(
    ("stored", "measured", "remeasured", "agrees"),
    [
        (1.0, 1.0, False, True),  # agrees: kept
        (5.0, 1.0, True, True),  # measured under a load that has gone: measured again
        (5.0, 0.2, True, False),  # still off: sd's gamma is not chosen from it
    ],
)
def test_the_bench_checks_its_profile(
    compose_cfg, tiny, monkeypatch, stored, measured, remeasured, agrees
) -> None:
    models, engine = tiny
    cfg = compose_cfg("stage=bench", "bench.gamma_max=3", "bench.latency.unchecked_gamma=5")
    calls: list[int] = []

    def measure(*args, **kwargs):
        calls.append(1)
        return profile(measured)

    monkeypatch.setattr(stage, "profile_models", measure)
    monkeypatch.setattr(engine.target, "forward_times", lambda: run_times(1.0))
    got, verdict = stage.checked_profile(
        cfg, engine, models, torch.device("cpu"), [1], profile(stored), PROMPT
    )
    assert bool(calls) == remeasured and verdict.agrees == agrees
    assert got.target_ms[1] == pytest.approx(MS[1] * (measured if remeasured else stored))
    if remeasured:
        assert (Path(cfg.experiment_dir) / "bench" / "latency.json").exists()
    gamma = stage.sd_gamma(cfg, got, 0.6, 1, verdict)
    if agrees:
        assert gamma == got.best_gamma(0.6, range(0, 4), 1)
        assert profile_warning({"latency_profile": {"check": verdict.as_dict()}}) is None
    else:
        assert gamma == 5
        warning = profile_warning({"latency_profile": {"check": verdict.as_dict()}})
        assert "could not be made to agree" in warning and "5.00x" in warning
