"""benchmarks/compile_ab.py: decoding.compile=true against false in one run, at tiny size on
the CPU: both variants of every method at every batch size, the tokens of a method whose
rows decide alone the same compiled as eager (float32, same seeds), and the draft step
against its floor through both engines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_compiled_and_eager_run_side_by_side_on_the_tiny_models(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "compile_ab.py"),
            f"artifacts_root={tmp_path}",
            "experiment=ab",
            "models=tiny_random",
            "dtype=float32",  # auto is bfloat16 on a CPU with native bf16: rounding may differ
            "bench.methods=[target_only,svip]",
            "bench.num_prompts=3",
            "bench.max_new_tokens=6",
            "bench.batch_sizes=[1,2]",
            "bench.gamma_max=2",
            "bench.law_distance_prompts=0",
            "bench.judge.enabled=false",
            "bench.energy=false",
            "draft_eval.floor_reps=3",
            "floor=true",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "ab" / "compile_ab"
    result = json.loads((out / "results.json").read_text())
    assert set(result["batches"]) == {"1", "2"}
    for per in result["batches"].values():
        assert set(per["methods"]) == {"target_only", "svip"}
        for row in per["methods"].values():
            eager, compiled = row["eager"], row["compiled"]
            assert eager["tokens"] == compiled["tokens"] > 0
            assert row["compiled_over_eager"] == pytest.approx(
                compiled["tokens_per_s"] / eager["tokens_per_s"]
            )
            assert row["same_tokens"]  # neither plans from timings: the same draws
    assert set(result["latency_profiles"]) == {"eager", "compiled"}
    for floor in result["floors"].values():
        assert floor["floor_ms"] > 0 and floor["engine_step_ms"] > 0
    assert "| 2 | svip |" in (out / "results.md").read_text()
    # each variant measured its own latency profile in its own folder
    assert (tmp_path / "ab" / "compile_ab" / "compiled" / "bench" / "latency.json").exists()
