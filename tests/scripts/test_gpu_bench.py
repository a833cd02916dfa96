"""benchmarks/gpu_bench.sh, the one command for a lent GPU, tried on the CPU: every step's
failure is reported and the next step still runs; at tiny size it runs end to end and the
folder holds the bench's, draft_eval's and the profile's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_bench.sh"
STEPS = [
    "install",
    "profile",
    "pipeline",
    "bench",
    "gpu_tests",
    "profile_sd",
    "profile_eager",
    "draft_eval",
]


def run_script(out: Path, timeout: int = 300, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, "OUT": str(out), "STEPS": ",".join(STEPS), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def steps(out: Path) -> dict[str, str]:
    rows = (out / "steps.tsv").read_text().splitlines()
    return {name: verdict for name, verdict, _ in (row.split("\t") for row in rows)}


def test_every_failed_step_is_reported_and_the_next_one_still_runs(tmp_path: Path) -> None:
    done = run_script(tmp_path / "out", PYTHON="false", WHEELS=str(tmp_path / "none"))
    assert done.returncode == 1
    verdicts = steps(tmp_path / "out")
    assert list(verdicts) == STEPS
    assert all(v.startswith("FAILED") for v in verdicts.values())
    assert "failed: " + " ".join(STEPS) in done.stdout and "wall time:" in done.stdout


def test_a_step_past_its_limit_is_reported_as_timed_out(tmp_path: Path) -> None:
    slow = tmp_path / "python"  # answers a script on stdin at once, hangs on anything else
    slow.write_text('#!/bin/sh\n[ "$1" = - ] && exit 0\nsleep 30\n')
    slow.chmod(0o755)
    names = ("INSTALL", "PROFILE", "PIPELINE", "PROFILE_SD", "PROFILE_EAGER", "TESTS", "BENCH")
    names += ("DRAFT_EVAL",)
    limits = {f"T_{name}": "1" for name in names}
    done = run_script(tmp_path / "out", PYTHON=str(slow), WHEELS=str(tmp_path), **limits)
    assert done.returncode == 1
    verdicts = steps(tmp_path / "out")
    assert verdicts.pop("install") == "ok"
    assert set(verdicts.values()) == {"TIMED OUT after 1s"}


def test_a_misspelt_step_is_refused_naming_the_steps_before_any_work(tmp_path: Path) -> None:
    done = run_script(tmp_path / "out", STEPS="install,bnech", PYTHON="false")
    assert done.returncode == 2
    assert "bnech" in done.stderr and "== install" not in done.stdout
    assert all(name in done.stderr for name in STEPS)
    assert not (tmp_path / "out").exists()  # refused before the folder, let alone a step
    assert run_script(tmp_path / "out", STEPS=",", PYTHON="false").returncode == 2


def test_a_carried_compile_cache_that_is_not_there_is_refused_by_name_before_any_work(
    tmp_path: Path,
) -> None:
    """A mistyped COMPILE_CACHE would cost every step a cold compile, unsaid: it is refused
    naming the folder it looked for, before OUT or a step; one that is there seeds OUT's."""
    missing = tmp_path / "brought_back" / "compile_cahce"
    done = run_script(tmp_path / "out", STEPS="install,bench", PYTHON="false",
                      COMPILE_CACHE=str(missing))  # fmt: skip
    assert done.returncode == 2, done.stdout[-2000:]
    assert f"COMPILE_CACHE={missing} refused: no folder {missing}" in done.stderr
    assert "== install" not in done.stdout and not (tmp_path / "out").exists()
    done = run_script(tmp_path / "out", STEPS="install", PYTHON="false", COMPILE_CACHE="no/cache")
    assert done.returncode == 2 and f"no folder {REPO}/no/cache" in done.stderr
    carried = tmp_path / "brought_back" / "compile_cache"
    (carried / "torch-x").mkdir(parents=True)
    (carried / "torch-x" / "graph").write_bytes(b"kernel")
    done = run_script(tmp_path / "out", STEPS="install", PYTHON="false", COMPILE_CACHE=str(carried))
    assert f"compile cache seeded from {carried}" in done.stdout
    assert (tmp_path / "out" / "compile_cache" / "torch-x" / "graph").read_bytes() == b"kernel"


# A stand-in for the stages, so a test can play a run that finishes, one cut short after a batch
# size and one stopped before any: everything else (the summary) goes to this Python.
FAKE_PYTHON = f"""#!{sys.executable}
import json, os, sys, time
from pathlib import Path
if sys.argv[1] == "-":
    os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])
args = dict(a.split("=", 1) for a in sys.argv[3:] if "=" in a)
stage, mode = args["stage"], os.environ["FAKE_" + args["stage"].upper()]
folder = Path(args["experiment_dir"])
if stage == "draft_eval" and mode != "fail":
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "draft_eval.json").write_text(json.dumps({{"alpha": float(mode)}}))
    sys.exit(0)
if stage == "bench" and mode != "stall":
    rate, cut = mode.split(":")
    bench = folder / "bench" / ("partial" if cut == "partial" else "")
    bench.mkdir(parents=True, exist_ok=True)
    methods = {{"sd": {{"tokens_per_s": float(rate)}}}}
    results = {{"device": "cpu", "dtype": "float32", "num_prompts": 2, "max_new_tokens": 8,
               "batches": {{"1": {{"methods": methods}}}}}}
    (bench / "results.json").write_text(json.dumps(results))
    (bench / "results.md").write_text(f"sd {{rate}} tokens/s")
    if cut != "partial":
        sys.exit(0)
if stage == "bench":
    time.sleep(30)  # the rest of the bench: past T_BENCH
sys.exit(1)
"""


def test_a_rerun_into_the_same_folder_never_reports_the_last_runs_figures(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    out = tmp_path / "out"

    def rerun(bench: str, draft_eval: str) -> tuple[int, str]:
        done = run_script(
            out, PYTHON=str(fake), STEPS="bench,draft_eval", T_BENCH="2",
            FAKE_BENCH=bench, FAKE_DRAFT_EVAL=draft_eval,
        )  # fmt: skip
        summary = (out / "summary.txt").read_text()
        assert summary in done.stdout
        return done.returncode, summary

    code, summary = rerun("111.1:complete", "0.777")
    assert code == 0 and "sd 111.1" in summary and "alpha 0.777" in summary
    assert "PARTIAL" not in summary
    assert json.loads((out / "results.json").read_text())["batches"]["1"]["methods"]["sd"]
    # timed out before a batch size, draft_eval failed: none of the first run's figures
    code, summary = rerun("stall", "fail")
    verdicts = steps(out)
    assert code == 1 and verdicts["bench"] == "TIMED OUT after 2s"
    assert verdicts["draft_eval"] == "FAILED (exit 1)"
    assert "111.1" not in summary and "0.777" not in summary
    assert "bench: no results" in summary
    assert not (out / "results.json").exists() and not (out / "draft_eval.json").exists()
    # timed out after a batch size: its own partial figures, said to be partial
    code, summary = rerun("222.2:partial", "0.5")
    assert code == 1 and "sd 222.2" in summary and "PARTIAL" in summary
    assert "111.1" not in summary and "alpha 0.5" in summary
    assert "222.2" in (out / "results.md").read_text()
    # a run of other steps reports nothing of the bench it did not run
    done = run_script(out, PYTHON=str(fake), STEPS="draft_eval", FAKE_DRAFT_EVAL="0.6")
    assert "222.2" not in done.stdout and "bench:" not in (out / "summary.txt").read_text()


@pytest.mark.slow
def test_the_script_runs_end_to_end_on_the_cpu_at_tiny_size(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_script(
        out,
        timeout=1200,  # the pipeline's stage chain and the compiles, on two busy cores
        PYTHON=sys.executable,
        DEVICE="cpu",
        DTYPE="float32",
        MODELS="tiny_random",
        PROMPTS="2",
        MAX_NEW_TOKENS="8",
        BATCH_SIZES="1,2",
        PROFILE_STEPS="4",
        PYTEST_PATHS="tests/decoding/test_decoding_gpu.py",
        PIPELINE_PROMPTS="16",
        PIPELINE_ARGS="data.max_prompt_tokens=48 data.val_fraction=0.25 data.test_fraction=0.25 "
        "harvest.continuation_tokens=8 harvest.batch_size=8 train.batch_size=64 "
        "tables.min_count=5 train.learning_curve=[] evaluate.ceiling.enabled=false",
        DRAFT_EVAL_ARGS="draft_eval.num_sequences=2 draft_eval.latency_reps=3 "
        "draft_eval.floor_reps=3 draft_eval.extra_sources=[]",
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert set(steps(out).values()) == {"ok"}
    results = json.loads((out / "results.json").read_text())
    assert set(results["batches"]) == {"1", "2"} and "hf_static" in results["methods"]
    # the pipeline step's own artifacts: the learned methods ran on them, none skipped
    assert {"sv", "sprinter", "sd_learned"} <= set(results["methods"]), results.get("skipped")
    assert "pipeline: test AUC" in done.stdout
    # the GPU harvest's figure: records/s over all mixes beside the teacher-forced phase alone
    assert "records/s over all mixes" in done.stdout and "all-mix ratio 0." in done.stdout
    assert results["settings"]["hf_static"]["compile"] is True  # COMPILE defaults to true
    assert "## Batch size 2" in (out / "results.md").read_text()
    assert json.loads((out / "draft_eval.json").read_text())["alpha"] > 0
    assert json.loads((out / "profile.json").read_text())["step_ms"] > 0
    assert "greedy tokens of sd (gamma 3" in (out / "profile_sd.txt").read_text()
    assert json.loads((out / "profile_eager.json").read_text())["compile_s"] == 0
    assert "step (unprofiled" in (out / "profile.txt").read_text()
    assert "tokens/s" in done.stdout and "wall time:" in done.stdout
    # every compiling step went through OUT's compile cache, which travels back with OUT
    compiled = results["provenance"]["compile"]
    assert compiled["cache_folder"].startswith(str(out / "compile_cache"))
    assert compiled["cache_hits"] + compiled["cache_misses"] > 0
    assert any((out / "compile_cache").rglob("*"))
