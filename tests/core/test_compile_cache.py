"""decoding.compile_cache: torch.compile's on-disk caches in one folder later processes read."""

from __future__ import annotations

import copy
import importlib.util
import os
from pathlib import Path

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch._functorch import config as functorch_config
from torch._inductor import config as inductor_config

from sprinter_train.bench.report.timing_lines import compile_line
from sprinter_train.core import compile_cache
from sprinter_train.core.compile_cache import (
    cache_folder,
    compile_record,
    step_of_its_own,
    use_compile_cache,
)
from sprinter_train.core.validation import ConfigError
from sprinter_train.decoding.runner.compile import shape_owner
from sprinter_train.models.tiny import build_tiny_model

REPO = Path(__file__).resolve().parents[2]
VERSION = f"torch-{torch.__version__}"
_spec = importlib.util.spec_from_file_location(
    "compile_cache_ab", REPO / "benchmarks" / "compile_cache_ab.py"
)
cache_ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cache_ab)
RUNS = cache_ab.RUNS


@pytest.fixture
def caches(monkeypatch):
    """Inductor's switches and folder as they were, after the test."""
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    graphs, autograd = inductor_config.fx_graph_cache, functorch_config.enable_autograd_cache
    with (
        inductor_config.patch(fx_graph_cache=graphs),
        functorch_config.patch(enable_autograd_cache=autograd),
        torch.compiler.config.patch(job_id=torch.compiler.config.job_id),
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
    assert torch.compiler.config.job_id == compile_cache.JOB  # dynamo's record of shapes too
    assert use_compile_cache(None) is None
    assert not inductor_config.fx_graph_cache and not functorch_config.enable_autograd_cache
    assert torch.compiler.config.job_id is None


def test_a_job_id_the_user_set_is_left_alone(caches, tmp_path) -> None:
    torch.compiler.config.job_id = "theirs"
    use_compile_cache(str(tmp_path))
    assert torch.compiler.config.job_id == "theirs"
    use_compile_cache(None)
    assert torch.compiler.config.job_id == "theirs"


class Stepper:
    """Two instances stand for two models' backends."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """Scales."""
        return x * self.scale


def test_each_owner_gets_a_step_code_of_its_own_named_the_same_in_every_process() -> None:
    one, other = Stepper(2.0), Stepper(3.0)
    a, b = step_of_its_own(one.step, "target"), step_of_its_own(other.step, "draft")
    again = step_of_its_own(Stepper(2.0).step, "target")
    assert a.__func__.__code__ is not b.__func__.__code__
    assert a.__name__ != b.__name__ and a.__name__ == again.__name__  # a hash, not an address
    assert a.__name__.startswith("step_") and a.__doc__ == Stepper.step.__doc__
    x = torch.ones(3)
    assert torch.equal(a(x), one.step(x)) and torch.equal(b(x), other.step(x))
    # dynamo keeps its graphs and its record of shapes per code object: one list each
    counter = CompileCounterWithBackend("eager")
    compiled = [torch.compile(f, backend=counter, dynamic=None) for f in (a, b)]
    for n in (4, 4, 5):
        compiled[0](torch.ones(n))
    assert counter.frame_count == 2  # static at 4, then symbolic
    compiled[1](torch.ones(5))  # the other owner's first size: static, not the first's symbolic
    compiled[1](torch.ones(6))
    assert counter.frame_count == 4  # one code for both: 3 (the first's record made 5 symbolic)


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


# the tiny pair on the CPU, over the script's settings
TINY = (
    "models=tiny_random",
    "experiment=cc",
    "device=cpu",
    "dtype=float32",
    "num_threads=1",
    "bench.num_prompts=2",
    "bench.max_new_tokens=8",
)


@pytest.mark.heavy  # two bench processes that compile
def test_a_second_bench_process_compiles_from_the_first_ones_cache(tmp_path) -> None:
    first, again = (cache_ab.bench_in_a_fresh_process(tmp_path, run, TINY, 900) for run in RUNS)
    cold, warm = first["provenance"]["compile"], again["provenance"]["compile"]
    assert cold["cache_misses"] > 0 and not cold["cache_hit"]
    # the second loads the graphs the first saved (`core.precompiled`) and compiles none
    assert warm["cache_hit"] and 0 < warm["cache_hits"] <= cold["cache_misses"]
    assert warm["cache_misses"] == 0
    assert again["stage_compile"]["cache_hit"] and not first["stage_compile"]["cache_hit"]
    verdict = cache_ab.compare(first, again, bar=0.2)  # the bar (it reads about 0.03)
    assert verdict["passed"], verdict["failures"]
    assert verdict["same_tokens"] and verdict["report_says_cache_hit"]


def good_pair() -> tuple[dict, dict]:
    """Two runs' results as bench_in_a_fresh_process returns them: a cold compile, then the
    same graphs all from the cache and the same figures."""
    methods = {
        "target_only": {"tokens": 16, "target_calls": 16, "draft_calls": 0, "target_ppl": 1.7},
        "sd": {"tokens": 16, "target_calls": 6, "draft_calls": 18, "target_ppl": 1.7},
    }
    cold = {"seconds": 40.0, "cache_folder": "/c", "cache_hits": 0, "cache_misses": 12}
    warm = {**cold, "seconds": 4.0, "cache_hits": 12, "cache_misses": 0, "cache_hit": True}
    first = {"provenance": {"compile": {**cold, "cache_hit": False}}, "methods": methods}
    again = {"provenance": {"compile": warm}, "methods": copy.deepcopy(methods)}
    for run in (first, again):
        run["report_compile_line"] = compile_line(run)
        run["stage_compile"], run["wall_seconds"] = run["provenance"]["compile"], 60.0
    return first, again


def test_the_ab_verdict_passes_a_good_pair_and_names_what_breaks() -> None:
    first, again = good_pair()
    verdict = cache_ab.compare(first, again, bar=0.2)
    assert verdict["passed"] and verdict["ratio"] == pytest.approx(0.1)
    assert verdict["same_tokens"] and verdict["report_says_cache_hit"]
    text = cache_ab.markdown(verdict)
    assert "| second | 4.0 | 12 | 0 | yes | 60.0 |" in text and "verdict: PASS" in text

    first, again = good_pair()
    again["methods"]["sd"]["tokens"] = 15
    verdict = cache_ab.compare(first, again, bar=0.2)
    assert not verdict["passed"] and verdict["differing"] == {"sd": ["tokens"]}
    assert "verdict: FAIL" in cache_ab.markdown(verdict)

    first, again = good_pair()
    again["provenance"]["compile"]["seconds"] = 9.0
    verdict = cache_ab.compare(first, again, bar=0.2)
    assert not verdict["passed"] and verdict["ratio"] == pytest.approx(0.225)
    assert cache_ab.compare(first, again, bar=0.35)["passed"]

    first, again = good_pair()  # a second run that compiled a graph anew
    again["provenance"]["compile"].update(cache_misses=1, cache_hit=False)
    again["report_compile_line"] = compile_line(again)
    verdict = cache_ab.compare(first, again, bar=0.2)
    assert not verdict["passed"] and not verdict["report_says_cache_hit"]
    assert len(verdict["failures"]) == 2


def test_an_override_replaces_the_scripts_setting_of_the_same_key(tmp_path) -> None:
    """Hydra refuses a setting named twice: the script's own gives way to the caller's."""
    overrides = cache_ab.overrides_for(tmp_path, "first", ("bench.num_prompts=5", "models=x"))
    assert [o for o in overrides if o.startswith("bench.num_prompts")] == ["bench.num_prompts=5"]
    assert cache_ab.setting(overrides, "artifacts_root") == str(tmp_path / "first" / "artifacts")
    assert f"decoding.compile_cache={tmp_path / 'cache'}" in overrides and "models=x" in overrides


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


def test_a_folder_that_cannot_be_made_is_refused_naming_the_setting(caches, tmp_path) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("not a folder")
    with pytest.raises(ConfigError, match=r"decoding.compile_cache=.*a-file.*Not a directory"):
        use_compile_cache(str(taken))
    assert compile_cache.ENV not in os.environ  # nothing was switched on


def test_models_of_other_shapes_own_other_steps_and_a_copy_shares_one() -> None:
    """As the tiny_random pair: a 3-layer target, a 1-layer draft."""
    model = build_tiny_model({"num_hidden_layers": 3})
    target = shape_owner(model, -1)
    assert shape_owner(build_tiny_model({"num_hidden_layers": 1}), -1) != target
    assert shape_owner(build_tiny_model({"num_hidden_layers": 3}, seed=1), -1) == target
    assert shape_owner(model, 2) != target  # another hidden state handed to verifiers
    assert shape_owner(copy.deepcopy(model).to(torch.bfloat16), -1) != target
