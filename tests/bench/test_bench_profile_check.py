"""bench/timing/profile_check.py and the bench's use of it: a latency profile that disagrees with the
run's own forwards is measured again, and if it still disagrees it chooses no gamma.

The run's forward times are fixed by patching the target runner's `forward_times`, which the
engine's timings read (no test reads the wall clock); the decode itself is real, on tiny
models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sprinter_train.bench.report.header_lines import gamma_line, profile_line, profile_warning
from sprinter_train.bench.run import profile_and_gamma as stage
from sprinter_train.bench.timing.latency import LatencyProfile
from sprinter_train.bench.timing.profile_check import ProfileCheck, check_profile, disagreement
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.builder import build_engine, build_runner
from sprinter_train.decoding.policies import SpeculativeDecoding, TargetOnly
from sprinter_train.models.loading import LoadedModel
from sprinter_train.models.roles import Roles
from sprinter_train.models.tiny import build_tiny_model
from tests.decoding_helpers import PACK_EVERY

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
    engine = build_engine(
        build_runner(model, 128),
        SamplingConfig(temperature=0),
        128,
        draft=build_runner(model, 128),
        pack_every=PACK_EVERY,
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
    history: list[str] = ["reused latency.json"]
    got, verdict = stage.checked_profile(
        cfg, engine, models, torch.device("cpu"), [1], profile(stored), PROMPT, history
    )
    assert bool(calls) == remeasured and verdict.agrees == agrees
    again = ["measured again: the previous one disagreed with the run's forwards"]
    assert history == ["reused latency.json", *(again if remeasured else [])]
    assert got.target_ms[1] == pytest.approx(MS[1] * (measured if remeasured else stored))
    if remeasured:
        assert (Path(cfg.experiment_dir) / "bench" / "latency.json").exists()
    gamma = stage.sd_gamma(cfg, got, 0.6, 1, verdict)
    if agrees:
        assert gamma == got.best_gamma(0.6, range(0, 4), 1)
        assert profile_warning({"latency_profile": {"check": verdict.as_dict()}}) is None
    else:  # unchecked_gamma=5 is capped at gamma_max=3: sd's planner plays only 0..3
        assert gamma == 3
        assert "capped at bench.gamma_max=3" in stage.gamma_source(cfg, verdict)
        record = {"latency_profile": {"check": verdict.as_dict(), "history": history}}
        warning = profile_warning(record)
        assert "could not be made to agree" in warning and "5.00x" in warning
        # what the run did, not "measured twice" (it was read from disk, then measured once)
        assert "reused latency.json; then measured again" in warning and "twice" not in warning
        assert "reused latency.json; then measured again" in profile_line(record)


def test_gamma_max_zero_checks_the_profile_at_a_width_it_covers(compose_cfg, tiny, monkeypatch):
    """bench.gamma_max=0: the profile covers one-token target forwards only, so its check must
    decode at gamma 0; at gamma 1 it found no profiled width, disagreed, and had the profile
    measured twice for nothing (issue 39, item 3). The run's forwards take the profile's times
    exactly (real decode, times replaced by width), so only the widths decide."""
    models, engine = tiny
    cfg = compose_cfg("stage=bench", "bench.gamma_max=0")
    covered = LatencyProfile({1: 30.0}, 3.0, None, 128, "cpu", "float32")
    real = engine.target.forward_times
    widths: list[int] = []

    def at_profile() -> list[tuple[int, int, float]]:
        done = real()
        widths.extend(width for _, width, _ in done)
        return [(rows, w, covered.target_ms.get(w, 99.0) / 1e3) for rows, w, _ in done]

    monkeypatch.setattr(engine.target, "forward_times", at_profile)
    calls: list[int] = []
    monkeypatch.setattr(stage, "profile_models", lambda *a, **k: calls.append(1) or covered)
    got, verdict = stage.checked_profile(
        cfg, engine, models, torch.device("cpu"), [1], covered, PROMPT
    )
    assert stage.check_gamma(0) == 0 and stage.check_gamma(1) == 1 and stage.check_gamma(8) == 4
    assert not calls and verdict.agrees and verdict.forwards > 0
    assert set(widths) - {len(PROMPT.input_ids)} == {1}  # no two-token verify was decoded
    assert stage.sd_gamma(cfg, got, 0.9, 1, verdict) == 0
    assert "gamma_max=0" in stage.gamma_source(cfg, verdict)


@pytest.mark.parametrize(
    ("overrides", "said", "unsaid"),
    [
        (("methods.sd.gamma=2",), "fixed by methods.sd.gamma", "optimum"),
        (("bench.gamma_max=0",), "bench.gamma_max=0: no drafts", "optimum"),
        ((), "the implied-speedup optimum over 0..8", "unchecked"),
    ],
)
def test_results_md_says_how_sds_gamma_was_chosen(compose_cfg, overrides, said, unsaid) -> None:
    """The report's gamma sentence reads results.json's `sd_gamma_source`: a fixed gamma or
    gamma_max=0 was called "the implied-speedup optimum" (issue 39, item 3)."""
    cfg = compose_cfg("stage=bench", *overrides)
    agrees = ProfileCheck(1.0, 1.0, 3, 2.0)
    line = gamma_line(
        {
            "sd_gamma": 0,
            "alpha": 0.5,
            "alpha_source": "records",
            "sd_gamma_source": (stage.gamma_source(cfg, agrees)),
        }
    )
    assert said in line and unsaid not in line


@pytest.mark.heavy  # a real tiny bench
def test_a_gamma_max_zero_bench_reports_the_gamma_sd_ran(compose_cfg) -> None:
    """bench.gamma_max=0 on tiny models: results.json and results.md say sd's gamma is 0, and
    every round sd's planner played was gamma 0 (the report said 2 while sd ran 0)."""
    from sprinter_train.__main__ import run_stage
    from sprinter_train.core.io import read_json

    cfg = compose_cfg(
        "stage=bench",
        "models=tiny_random",
        "experiment=gamma0",
        "num_threads=1",
        "sampling.temperature=0",
        "data.max_prompt_tokens=32",
        "bench.num_prompts=2",
        "bench.max_new_tokens=4",
        "bench.batch_sizes=[]",
        "bench.gamma_max=0",
        "bench.latency.reps=1",
        "bench.warmup_runs=0",
        "bench.min_timed_runs=1",
        "bench.law_distance_prompts=0",
        "bench.judge.enabled=false",
        "bench.energy=false",
        "bench.methods=[target_only,sd]",
    )
    run_stage(cfg)
    out = Path(cfg.experiment_dir) / "bench"
    results = read_json(out / "results.json")
    assert results["sd_gamma"] == 0 and results["gamma_max"] == 0
    assert "gamma_max=0" in results["sd_gamma_source"]
    rounds = results["settings"]["sd"]["planner"]["rounds_by_rows_and_gamma"]
    assert {g.split()[0] for per in rounds.values() for g in per} == {"0"}
    text = (out / "results.md").read_text()
    assert "sd's gamma = 0 at batch 1 (bench.gamma_max=0" in text and "optimum" not in text
