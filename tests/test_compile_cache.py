"""decoding.compile_cache: torch.compile's on-disk caches in one folder later processes read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._functorch import config as functorch_config
from torch._inductor import config as inductor_config

from sprinter_train.bench.report import compile_line
from sprinter_train.core import compile_cache
from sprinter_train.core.compile_cache import cache_folder, compile_record, use_compile_cache

REPO = Path(__file__).resolve().parents[1]
VERSION = f"torch-{torch.__version__}"


@pytest.fixture
def caches(monkeypatch):
    """Inductor's switches and folder as they were, after the test."""
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    graphs, autograd = inductor_config.fx_graph_cache, functorch_config.enable_autograd_cache
    with (
        inductor_config.patch(fx_graph_cache=graphs),
        functorch_config.patch(enable_autograd_cache=autograd),
    ):
        yield


def test_the_setting_names_a_folder_per_torch_version(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder("auto") == tmp_path / "xdg" / "sprinter_train" / "compile" / VERSION
    assert cache_folder(str(tmp_path / "c")) == tmp_path / "c" / VERSION
    assert cache_folder(None) is None and cache_folder("") is None
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_folder("~/kept") == tmp_path / "home" / "kept" / VERSION


def test_a_folder_turns_the_caches_on_there_and_null_turns_them_off(caches, tmp_path) -> None:
    folder = use_compile_cache(str(tmp_path))
    assert folder == tmp_path / VERSION and folder.is_dir()
    assert os.environ[compile_cache.ENV] == str(folder)
    assert inductor_config.fx_graph_cache and functorch_config.enable_autograd_cache
    assert use_compile_cache(None) is None
    assert not inductor_config.fx_graph_cache and not functorch_config.enable_autograd_cache


def test_the_record_counts_the_lookups_since_its_start(caches, tmp_path) -> None:
    """A compile of a fresh function misses, the same graph compiled again (dynamo's own
    in-memory cache reset) is served from the folder."""
    use_compile_cache(str(tmp_path))

    def step(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 3 + x.square()

    x = torch.arange(8.0)
    before = compile_cache.compile_counters()
    torch.compile(step, fullgraph=True)(x)
    first = compile_record(before, 1.5)
    assert first["cache_misses"] >= 1 and not first["cache_hit"] and first["seconds"] == 1.5
    torch._dynamo.reset()
    before = compile_cache.compile_counters()
    torch.compile(step, fullgraph=True)(x)
    again = compile_record(before, 0.1)
    assert again["cache_hits"] >= 1 and again["cache_misses"] == 0 and again["cache_hit"]
    assert again["cache_folder"] == str(tmp_path / VERSION)


def test_results_md_says_what_was_compiled_and_what_the_cache_served() -> None:
    record = {"seconds": 15.1, "cache_folder": "/c", "cache_hits": 12, "cache_misses": 0}
    line = compile_line({"provenance": {"compile": {**record, "cache_hit": True}}})
    assert line is not None and "15.1 s" in line and "12 of 12 graphs" in line
    assert "a cache hit" in line and "folder /c" in line
    cold = {**record, "cache_hits": 0, "cache_misses": 12, "cache_hit": False}
    assert "0 of 12 graphs" in compile_line({"provenance": {"compile": cold}})
    nothing = {"seconds": 0.0, "cache_hits": 0, "cache_misses": 0, "cache_hit": False}
    assert compile_line({"provenance": {"compile": nothing}}) is None
    assert compile_line({}) is None


BENCH = (
    "stage=bench",
    "models=tiny_random",
    "experiment=cc",
    "device=cpu",
    "dtype=float32",
    "num_threads=1",
    "sampling.temperature=0",
    "decoding.compile=true",
    "bench.methods=[target_only,sd]",
    "methods.sd.gamma=3",  # a fixed width: the same shapes in both runs, whatever the profile
    "bench.num_prompts=2",
    "bench.max_new_tokens=8",
    "bench.batch_sizes=[1]",
    "bench.latency.reps=1",
    "bench.judge.enabled=false",
)
SAME_TOKENS = ("tokens", "target_calls", "draft_calls", "target_ppl")


def bench_in_a_fresh_process(root: Path) -> dict:
    command = [
        sys.executable,
        "-m",
        "sprinter_train",
        *BENCH,
        f"artifacts_root={root / 'artifacts'}",
        f"checkpoints_root={root / 'checkpoints'}",
        f"decoding.compile_cache={root / 'cache'}",
        f"hydra.run.dir={root / 'hydra'}",
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((root / "artifacts" / "cc" / "bench" / "results.json").read_text())
    # the stage's own result (printed last) says what it compiled, as every stage's does
    printed = json.loads(done.stdout[done.stdout.rindex("\n{") :])
    results["stage_compile"] = printed["compile"]
    return results


@pytest.mark.heavy  # two bench processes that compile
def test_a_second_bench_process_compiles_from_the_first_ones_cache(tmp_path) -> None:
    first = bench_in_a_fresh_process(tmp_path)
    again = bench_in_a_fresh_process(tmp_path)
    cold, warm = first["provenance"]["compile"], again["provenance"]["compile"]
    assert cold["cache_misses"] > 0 and not cold["cache_hit"]
    assert warm["cache_hit"] and warm["cache_hits"] == cold["cache_misses"] + cold["cache_hits"]
    assert warm["seconds"] <= 0.35 * cold["seconds"], (cold, warm)
    assert again["stage_compile"]["cache_hit"] and not first["stage_compile"]["cache_hit"]
    report = (tmp_path / "artifacts" / "cc" / "bench" / "results.md").read_text()
    assert (
        f"{warm['cache_hits']} of {warm['cache_hits']} graphs came from the compile cache" in report
    )
    for method, figures in first["methods"].items():
        assert {k: figures[k] for k in SAME_TOKENS} == {
            k: again["methods"][method][k] for k in SAME_TOKENS
        }, method


def test_a_shared_object_cut_short_by_a_killed_compile_is_swept(caches, tmp_path) -> None:
    """A build killed mid-write leaves a .so inductor would load by its key and fail on ("file
    too short"); the next stage's start deletes it, so inductor builds it again."""
    library = Path(torch.__file__).parent / "lib" / "libc10.so"
    folder = tmp_path / VERSION / "rt"
    folder.mkdir(parents=True)
    whole, cut = folder / "whole.so", folder / "cut.so"
    whole.write_bytes(library.read_bytes())
    cut.write_bytes(library.read_bytes()[: library.stat().st_size // 2])
    (folder / "empty.so").write_bytes(b"")
    use_compile_cache(str(tmp_path))
    assert whole.exists() and not cut.exists() and not (folder / "empty.so").exists()
