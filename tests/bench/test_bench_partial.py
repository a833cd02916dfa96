"""A bench stopped between batch sizes says what it kept (issue 39 item 6): SIGTERM after
batch 1 reported "None of the parts it reports had finished" while bench/partial/ held
results.json and a results.md that read as a complete run at batch size [1]."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from sprinter_train.__main__ import run_stage
from sprinter_train.bench.run import decode
from sprinter_train.core.interrupt import StageInterrupted
from sprinter_train.core.io import read_json


@pytest.mark.heavy  # a real tiny bench
def test_a_bench_stopped_after_batch_one_names_and_marks_its_partial_results(
    compose_cfg, monkeypatch
) -> None:
    cfg = compose_cfg(
        "stage=bench",
        "models=tiny_random",
        "experiment=stopped",
        "num_threads=1",
        "sampling.temperature=0",
        "data.max_prompt_tokens=32",
        "bench.num_prompts=2",
        "bench.max_new_tokens=4",
        "bench.batch_sizes=[2]",
        "bench.gamma_max=2",
        "bench.latency.reps=1",
        "bench.warmup_runs=0",
        "bench.min_timed_runs=1",
        "bench.law_distance_prompts=0",
        "bench.judge.enabled=false",
        "bench.energy=false",
        "bench.methods=[target_only,sd]",
    )
    decode_groups, calls = decode.run_methods, []

    def sigterm_in_batch_two(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # batch 1 is measured and written: the scheduler stops us
            os.kill(os.getpid(), signal.SIGTERM)
        return decode_groups(*args, **kwargs)

    monkeypatch.setattr(decode, "run_methods", sigterm_in_batch_two)
    with pytest.raises(StageInterrupted) as stopped:
        run_stage(cfg)
    report = stopped.value.report()
    partial = Path(cfg.experiment_dir) / "bench" / "partial"
    assert "None of the parts" not in report
    assert "batch sizes [1] of [1, 2]" in report and str(partial) in report
    first = (partial / "results.md").read_text().splitlines()[0]
    assert first.startswith("# PARTIAL bench: stopped") and "[1] of [1, 2]" in first
    results = read_json(partial / "results.json")
    assert results["partial"] == {"batch_sizes_done": [1], "batch_sizes": [1, 2]}
    assert not (partial.parent / "results.json").exists()  # no complete run is claimed
    history = results["latency_profile"]["history"]  # a fresh experiment: nothing to reuse
    assert history[0] == "measured in this run"
    assert f"a row; {'; then '.join(history)})" in (partial / "results.md").read_text()


@pytest.mark.heavy  # a real tiny bench
def test_a_bench_whose_every_method_is_skipped_says_why(compose_cfg) -> None:
    """bench.methods=[sprinter] without a trained verifier: every method skipped used to
    divide by zero while rotating the method order (issue 39 item 8's crash by another
    road); it stops naming the skip and the command that makes the verifier."""
    cfg = compose_cfg(
        "stage=bench",
        "models=tiny_random",
        "experiment=nothing",
        "num_threads=1",
        "data.max_prompt_tokens=32",
        "bench.num_prompts=1",
        "bench.max_new_tokens=2",
        "bench.batch_sizes=[]",
        "bench.gamma_max=1",
        "bench.latency.reps=1",
        "bench.judge.enabled=false",
        "bench.methods=[sprinter]",
    )
    with pytest.raises(ValueError, match=r"every method of bench.methods was skipped.*stage=train"):
        run_stage(cfg)
