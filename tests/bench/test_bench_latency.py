"""The latency profile's arithmetic: lookups, extrapolation, round costs and the best gamma."""

from __future__ import annotations

from pathlib import Path

import pytest

from sprinter_train.bench.timing.latency import LatencyProfile, profile_models
from sprinter_train.core import machine
from sprinter_train.core.distributions import implied_speedup
from sprinter_train.core.io import CorruptInputError
from sprinter_train.decoding.builder import build_engine, build_runner
from sprinter_train.models.tiny import build_tiny_model
from tests.decoding_helpers import PACK_EVERY


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


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_a_profile_through_the_engines_runners_times_their_layouts(static: bool) -> None:
    """The bench's profile times the engine's own forwards (the lean restricted draft's
    step, a static target's) and leaves the runners' forward timings to the run."""
    import torch

    from sprinter_train.bench.run.profile_and_gamma import timed_kernels
    from sprinter_train.core.sampling import SamplingConfig
    from sprinter_train.models.loading import LoadedModel
    from sprinter_train.models.roles import Roles

    target = build_tiny_model({}, seed=0).float()
    draft = build_tiny_model({"head_vocab_size": 32, "num_hidden_layers": 1}, seed=1).float()
    engine = build_engine(
        build_runner(target, 128, {"static": static}),
        SamplingConfig(0.0),
        128,
        draft=build_runner(draft, 128),
        pack_every=PACK_EVERY,
    )
    measured = profile_models(
        target, draft, None, 2, 2, 16, torch.device("cpu"), [1, 2], runners=engine.runners
    )
    assert sorted(measured.target_ms) == [1, 2, 3] and sorted(measured.batch_target_ms) == [2]
    assert all(v > 0 for v in measured.target_ms.values()) and measured.draft_ms > 0
    assert engine.target.forward_times() == [] and engine.draft.forward_times() == []
    models = Roles(
        LoadedModel("draft", draft, None), LoadedModel("target", target, None), None, 128, None
    )
    layouts = timed_kernels(models, engine)["layouts"]
    assert layouts == {"target": "static" if static else "dynamic", "draft": "lean"}
    assert build_runner(target, 128, {"static": True, "compiled": True}).layout == "compiled:packed"


def batched() -> LatencyProfile:
    """Batch 1 as above; at batch 4 and 8 the target's forward grows with tokens a row."""
    return LatencyProfile(
        {1: 30.0, 2: 31.0, 3: 33.0, 4: 46.0},
        3.0,
        2.0,
        128,
        "cpu",
        "bfloat16",
        batch_target_ms={4: {1: 40.0, 2: 50.0, 3: 60.0, 4: 70.0}, 8: {1: 60.0, 2: 90.0, 3: 120.0}},
        batch_draft_ms={4: 5.0, 8: 9.0},
        batch_companion_ms={4: 3.0, 8: 4.0},
    )


def test_batch_sizes_between_and_past_the_measured_ones() -> None:
    p = batched()
    assert p.batch_sizes == [1, 4, 8]
    assert p.target_batch_s(4, 2) == pytest.approx(0.050)  # measured
    assert p.target_batch_s(1, 3) == pytest.approx(p.target_s(3)) == pytest.approx(0.033)
    assert p.target_batch_s(2, 1) == pytest.approx((30.0 + (40.0 - 30.0) / 3) / 1e3)  # between
    assert p.target_batch_s(6, 3) == pytest.approx(0.090)  # halfway from 60 to 120
    assert p.target_batch_s(16, 1) == pytest.approx((60.0 + 8 * 5.0) / 1e3)  # 4 -> 8 slope
    assert p.target_batch_s(8, 4) == pytest.approx(0.150)  # tokens a row: the last slope
    assert p.draft_step_s(1) == pytest.approx(0.005) and p.draft_step_s(8) == pytest.approx(0.013)
    assert p.draft_step_s(6) == pytest.approx((7.0 + 3.5) / 1e3)
    # a noisy measurement that falls with size never extrapolates downwards
    noisy = LatencyProfile({1: 30.0, 2: 29.0}, 3.0, None, 128, "cpu", "float32")
    assert noisy.target_batch_s(1, 5) == pytest.approx(0.029)
    assert noisy.draft_step_s(64) == pytest.approx(0.003)  # one measured size: flat


def test_gamma_is_chosen_at_each_batch_size() -> None:
    p = batched()
    assert p.c_at(4) == pytest.approx(5.0 / 40.0) and p.c == pytest.approx(0.1)
    assert p.verify_cost(2, batch_size=4) == pytest.approx(60.0 / 40.0)
    for size in (1, 4, 8):
        best = p.best_gamma(0.8, range(1, 6), size)
        speedups = {
            g: implied_speedup(0.8, g, p.c_at(size), p.verify_cost(g, size)) for g in range(1, 6)
        }
        assert speedups[best] == max(speedups.values())
    # at batch 8 each token a row costs half a forward: drafting far stops paying
    assert p.best_gamma(0.8, range(1, 6), 8) < p.best_gamma(0.8, range(1, 6), 1)
    # and at a low acceptance no draft pays there: gamma 0 is target-only decoding
    assert p.best_gamma(0.3, range(0, 6), 8) == 0 and p.best_gamma(0.3, range(0, 6), 1) > 0


def test_per_batch_profile_of_tiny_models(tmp_path: Path) -> None:
    import torch

    target = build_tiny_model({}, seed=0)
    draft = build_tiny_model({"num_hidden_layers": 1}, seed=1)
    companion = build_tiny_model({"num_hidden_layers": 1}, seed=2)
    measured = profile_models(target, draft, companion, 2, 2, 16, torch.device("cpu"), [3, 1])
    assert measured.batch_sizes == [1, 3]
    assert sorted(measured.target_ms) == [1, 2, 3] == sorted(measured.batch_target_ms[3])
    assert set(measured.batch_draft_ms) == set(measured.batch_companion_ms) == {3}
    assert all(v > 0 for v in measured.batch_target_ms[3].values())
    assert measured.covers([1, 3], 3) and not measured.covers([1, 3], 4)
    assert not measured.covers([1, 4], 3)
    measured.save(tmp_path / "latency.json")
    assert LatencyProfile.load(tmp_path / "latency.json") == measured


def test_a_profile_saved_before_batch_sizes_loads_as_batch_one(tmp_path: Path) -> None:
    from sprinter_train.core.io import write_json

    old = {k: v for k, v in profile().__dict__.items() if not k.startswith("batch_")}
    write_json(tmp_path / "latency.json", old)
    loaded = LatencyProfile.load(tmp_path / "latency.json")
    assert loaded == profile() and loaded.batch_sizes == [1] and not loaded.covers([1, 4], 2)


@pytest.mark.parametrize(
    ("text", "problem"),
    [('{"target_ms": {"1": 3', "Expecting"), ("[1, 2]", "not an object"), ("{}", "no target_ms")],
)
def test_a_truncated_or_foreign_profile_names_the_file_and_the_remedy(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "latency.json"
    path.write_text(text)
    with pytest.raises(CorruptInputError, match=f"latency.json is corrupt.*{problem}.*stage=bench"):
        LatencyProfile.load(path)


def test_the_bench_reuses_a_profile_only_when_it_covers_the_run(compose_cfg, monkeypatch) -> None:
    import torch

    from sprinter_train.bench.run import profile_and_gamma as stage
    from sprinter_train.models.loading import LoadedModel
    from sprinter_train.models.roles import Roles
    from sprinter_train.models.tiny import build_tiny_tokenizer

    tokenizer, cpu = build_tiny_tokenizer(), torch.device("cpu")
    model = build_tiny_model({"num_hidden_layers": 1}, seed=0)
    loaded = LoadedModel("tiny", model, tokenizer)
    models = Roles(draft=loaded, target=loaded, companion=None, vocab_size=128, eos_token_id=None)
    settings = ("bench.gamma_max=2", "bench.latency.reps=1", "bench.latency.context_tokens=8")
    cfg = compose_cfg("stage=bench", "experiment=lat", *settings)
    first = stage.latency_profile(cfg, models, cpu, [1, 2])
    measured: list[list[int]] = []
    real = stage.profile_models
    monkeypatch.setattr(
        stage, "profile_models", lambda *a, **k: measured.append(a[-1]) or real(*a, **k)
    )
    assert stage.latency_profile(cfg, models, cpu, [1, 2]) == first  # covered: read back
    assert stage.latency_profile(cfg, models, cpu, [2]) == first
    assert not measured
    wider = stage.latency_profile(cfg, models, cpu, [1, 4])  # batch 4 was never measured
    assert measured == [[1, 4]] and wider.batch_sizes == [1, 4]
    longer = compose_cfg("stage=bench", "experiment=lat", *settings, "bench.gamma_max=3")
    assert sorted(stage.latency_profile(longer, models, cpu, [1, 4]).target_ms) == [1, 2, 3, 4]
    path = Path(cfg.experiment_dir) / "bench" / "latency.json"
    stale = LatencyProfile.load(path)
    stale.dtype = "bfloat16"  # measured in another precision
    stale.save(path)
    stage.latency_profile(longer, models, cpu, [1, 4])
    assert len(measured) == 3
    off = compose_cfg("stage=bench", "experiment=lat", *settings, "bench.latency.reuse=false")
    stage.latency_profile(off, models, cpu, [1])
    assert len(measured) == 4


@pytest.mark.parametrize(
    ("load", "reused"),
    [
        ({"start": 0.0, "end": 0.0}, True),
        ({"start": 64.0, "end": 0.0}, False),  # measured beside another job
        (None, False),  # no load recorded: cannot be trusted
    ],
)
def test_a_profile_measured_under_load_is_measured_again(
    compose_cfg, monkeypatch, load, reused
) -> None:
    import torch

    from sprinter_train.bench.run import profile_and_gamma as bench_stage
    from sprinter_train.models.loading import LoadedModel
    from sprinter_train.models.roles import Roles

    cfg = compose_cfg("bench.gamma_max=3")
    model = build_tiny_model({}, seed=0)
    loaded = LoadedModel("tiny", model, None)
    models = Roles(loaded, loaded, None, 128, None)
    stored = profile()
    stored.dtype, stored.load_average = "float32", load
    stored.models = bench_stage.timed_models(models)
    stored.kernels = bench_stage.timed_kernels(models)
    stored.save(Path(cfg.experiment_dir) / "bench" / "latency.json")
    fresh = profile()
    monkeypatch.setattr(bench_stage, "profile_models", lambda *args, **kwargs: fresh)
    monkeypatch.setattr(machine, "usable_cores", lambda *a: 2)
    got = bench_stage.latency_profile(cfg, models, torch.device("cpu"), [1])
    assert (got is not fresh) == reused
    assert got.load_average == load if reused else got is fresh


def test_a_profile_of_other_models_is_measured_again(compose_cfg, monkeypatch) -> None:
    """A profile timed without a companion, reused by a bench with one, priced the companion's
    step at nothing (`companion_ms` null) and sv planned as if it were free."""
    import torch

    from sprinter_train.bench.run import profile_and_gamma as bench_stage
    from sprinter_train.models.loading import LoadedModel
    from sprinter_train.models.roles import Roles

    cfg = compose_cfg("bench.gamma_max=3")
    loaded = LoadedModel("tiny", build_tiny_model({}, seed=0), None)
    pair = Roles(loaded, loaded, None, 128, None)
    companion = LoadedModel("companion", build_tiny_model({}, seed=1), None)
    trio = Roles(loaded, loaded, companion, 128, None)
    stored = profile()
    stored.dtype, stored.load_average = "float32", {"start": 0.0, "end": 0.0}
    stored.models = bench_stage.timed_models(pair)
    stored.kernels = bench_stage.timed_kernels(pair)
    stored.save(Path(cfg.experiment_dir) / "bench" / "latency.json")
    fresh = profile()
    monkeypatch.setattr(bench_stage, "profile_models", lambda *args, **kwargs: fresh)
    monkeypatch.setattr(machine, "usable_cores", lambda *a: 2)
    assert bench_stage.latency_profile(cfg, pair, torch.device("cpu"), [1]) is not fresh
    assert bench_stage.latency_profile(cfg, trio, torch.device("cpu"), [1]) is fresh


@pytest.mark.parametrize("change", ["pack", "threads", "unrecorded"])
def test_a_profile_of_other_kernels_is_measured_again(compose_cfg, monkeypatch, change) -> None:
    """Prepacking float32 linears halved a 2-token verify and left the 1-token step (what the
    run's own check compares) where it was: a profile of the plain linears was reused and
    priced every verify block at twice its cost. So are other thread counts and profiles
    that recorded no kernels."""
    import torch

    from sprinter_train.bench.run import profile_and_gamma as bench_stage
    from sprinter_train.models.loading import LoadedModel
    from sprinter_train.models.packed import pack_linears
    from sprinter_train.models.roles import Roles

    cfg = compose_cfg("bench.gamma_max=3")
    loaded = LoadedModel("tiny", build_tiny_model({}, seed=0), None)
    pair = Roles(loaded, loaded, None, 128, None)
    stored = profile()
    stored.dtype, stored.load_average = "float32", {"start": 0.0, "end": 0.0}
    stored.models = bench_stage.timed_models(pair)
    stored.kernels = None if change == "unrecorded" else bench_stage.timed_kernels(pair)
    stored.save(Path(cfg.experiment_dir) / "bench" / "latency.json")
    fresh = profile()
    monkeypatch.setattr(bench_stage, "profile_models", lambda *args, **kwargs: fresh)
    monkeypatch.setattr(machine, "usable_cores", lambda *a: 2)
    if change == "pack":
        assert pack_linears(loaded.model) > 0
    threads = torch.get_num_threads()
    if change == "threads":
        torch.set_num_threads(threads + 1)
    try:
        assert bench_stage.latency_profile(cfg, pair, torch.device("cpu"), [1]) is fresh
    finally:
        torch.set_num_threads(threads)
