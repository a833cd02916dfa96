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

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_bench.sh"
STEPS = ["install", "profile", "bench", "gpu_tests", "profile_sd", "profile_eager", "draft_eval"]


def run_script(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, "OUT": str(out), "STEPS": ",".join(STEPS), **env},
        capture_output=True,
        text=True,
        timeout=300,
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
    names = ("INSTALL", "PROFILE", "PROFILE_SD", "PROFILE_EAGER", "TESTS", "BENCH", "DRAFT_EVAL")
    limits = {f"T_{name}": "1" for name in names}
    done = run_script(tmp_path / "out", PYTHON=str(slow), WHEELS=str(tmp_path), **limits)
    assert done.returncode == 1
    verdicts = steps(tmp_path / "out")
    assert verdicts.pop("install") == "ok"
    assert set(verdicts.values()) == {"TIMED OUT after 1s"}


@pytest.mark.slow
def test_the_script_runs_end_to_end_on_the_cpu_at_tiny_size(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_script(
        out,
        PYTHON=sys.executable,
        DEVICE="cpu",
        DTYPE="float32",
        MODELS="tiny_random",
        PROMPTS="2",
        MAX_NEW_TOKENS="8",
        BATCH_SIZES="1,2",
        PROFILE_STEPS="4",
        PYTEST_PATHS="tests/test_decoding_gpu.py",
        DRAFT_EVAL_ARGS="draft_eval.num_sequences=2 draft_eval.latency_reps=3 "
        "draft_eval.floor_reps=3 draft_eval.extra_sources=[]",
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert set(steps(out).values()) == {"ok"}
    results = json.loads((out / "results.json").read_text())
    assert set(results["batches"]) == {"1", "2"} and "hf_static" in results["methods"]
    assert results["settings"]["hf_static"]["compile"] is True  # COMPILE defaults to true
    assert "## Batch size 2" in (out / "results.md").read_text()
    assert json.loads((out / "draft_eval.json").read_text())["alpha"] > 0
    assert json.loads((out / "profile.json").read_text())["step_ms"] > 0
    assert "greedy tokens of sd (gamma 3" in (out / "profile_sd.txt").read_text()
    assert json.loads((out / "profile_eager.json").read_text())["compile_s"] == 0
    assert "step (unprofiled" in (out / "profile.txt").read_text()
    assert "tokens/s" in done.stdout and "wall time:" in done.stdout
