"""Compiled steps saved whole with their guards (`core.precompiled`): a later process loads
and runs them without tracing, with the tokens the eager step emits.

"A later process" is this one with the folder's in-process shelf emptied: the graphs then
come from their files alone. The graphs compile with AOTAutograd's `aot_eager` backend
(dynamo's tracing and guards, AOTAutograd's graph, no inductor code generation): seconds,
not minutes; the inductor path across real processes is the bench A/B's
(`test_compile_cache.py`, `benchmarks/compile_cache_ab.py`).
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import time
from types import SimpleNamespace

import pytest
import torch

from sprinter_train.core import compile_cache, precompiled
from sprinter_train.core.precompiled import PrecompiledStep, portable_guards
from sprinter_train.decoding.builder import build_runner
from sprinter_train.decoding.policies import (
    SVIP,
    SpeculativeDecoding,
    SpecVerification,
    Sprinter,
    TargetOnly,
)
from sprinter_train.decoding.runner import compile as compiled
from sprinter_train.decoding.runner.compile import SYMBOLIC, step_identity
from sprinter_train.decoding.runner.requests import ForwardRequest
from sprinter_train.decoding.runner.runner import ModelRunner
from sprinter_train.models.body import StaticBody
from sprinter_train.models.packed import pack_linears
from sprinter_train.models.tiny import build_tiny_model
from tests.decoding_helpers import (
    GREEDY,
    PROMPTS,
    SAMPLING,
    VOCAB,
    ATable,
    engine_for,
    tiny_trio,
)

NEW_TOKENS = 10


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return tiny_trio()


@pytest.fixture
def later_process(monkeypatch):
    """Empty the shelves of loaded graphs, as a new process starts: call it between runs."""
    monkeypatch.setattr(precompiled, "_SHELVES", {})
    return lambda: precompiled._SHELVES.clear()


def forwards(runner: ModelRunner) -> list[torch.Tensor]:
    """A prompt's prefill, then one-token and four-token blocks: both of a step's graphs."""
    cache = runner.new_cache(1, 32)
    runner.prime(cache, [PROMPTS[0]])
    out = []
    for width in (1, 4, 1):
        ids = torch.full((1, width), 5)
        request = ForwardRequest(ids, torch.tensor([width]), torch.tensor([[width - 1]]))
        out.append(runner.run(cache, request).logits)
    return out


def saved_step(runner: ModelRunner, folder) -> PrecompiledStep:
    """The compiled runner's static body as a saved step in `folder` (aot_eager), swapped
    in for the plain compile it was built with (no folder in use), before any call."""
    step = PrecompiledStep(runner.backend.body, folder, SYMBOLIC, backend="aot_eager")
    runner.backend.step = step
    return step


def test_portable_guards_keep_what_a_later_process_can_check() -> None:
    def entry(kind: str, derived: tuple[str, ...] = (), is_global: bool = False):
        return SimpleNamespace(guard_type=kind, derived_guard_types=derived, is_global=is_global)

    kept = portable_guards(
        [
            entry("TENSOR_MATCH"),
            entry("CONSTANT_MATCH", ("EQUALS_MATCH",)),
            entry("ID_MATCH"),
            entry("CLASS_MATCH", ("ID_MATCH",)),  # an identity under another name
            entry("CLOSURE_MATCH"),
            entry("TYPE_MATCH", is_global=True),  # a global: the folder's name stands for it
        ]
    )
    assert kept == [True, True, False, False, False, False]


@pytest.mark.heavy  # dynamo traces two graphs (aot_eager)
def test_a_later_process_runs_the_saved_graphs_and_compiles_nothing(
    models, tmp_path, later_process, caplog
) -> None:
    """The first run compiles and saves two graphs (one-token blocks, wider ones) with the
    eager step's outputs; the next loads them, compiles nothing, counts them as cache hits
    and gives the same outputs. A file that cannot be loaded is removed, with a warning."""
    eager = forwards(build_runner(models["target"], VOCAB, {"static": True}))
    first_runner = build_runner(models["target"], VOCAB, {"static": True, "compiled": True})
    first = saved_step(first_runner, tmp_path)
    outputs = forwards(first_runner)
    assert first.compiled == 2 and len(list(tmp_path.glob("*.graph"))) == 2
    for got, want in zip(outputs, eager, strict=True):
        torch.testing.assert_close(got, want)
    (tmp_path / "cut-short.graph").write_bytes(b"not a graph")

    later_process()
    before = compile_cache.compile_counters()
    graphs_before = compiled.compiled_graphs()
    again_runner = build_runner(models["target"], VOCAB, {"static": True, "compiled": True})
    again = saved_step(again_runner, tmp_path)
    with caplog.at_level(logging.WARNING, logger=precompiled.__name__):
        repeated = forwards(again_runner)
    assert again.compiled == 0 and compiled.compiled_graphs() == graphs_before
    after = compile_cache.compile_counters()
    assert after["hits"] - before["hits"] == 2 and after["misses"] == before["misses"]
    assert "cut-short.graph, which failed to load" in caplog.text
    assert not (tmp_path / "cut-short.graph").exists()
    for got, want in zip(repeated, outputs, strict=True):
        assert torch.equal(got, want)
    assert again_runner.compile_seconds > 0  # the load is this process's compile


def test_a_save_cut_short_leaves_nothing_a_later_load_keeps(tmp_path) -> None:
    """A save writes a temporary file and renames it: one left by a killed process is
    removed once stale, one that may still be under way stays, and neither is loaded."""
    stale, fresh = tmp_path / "tmpstale", tmp_path / "tmpfresh"
    for path in (stale, fresh):
        path.write_bytes(b"half a graph")
    old = time.time() - precompiled.STALE_S - 60
    os.utime(stale, (old, old))
    assert precompiled.load_folder(tmp_path) == []
    assert not stale.exists() and fresh.exists()


def test_a_graph_dynamo_cannot_save_falls_back_to_a_plain_compile(
    models, tmp_path, monkeypatch, caplog
) -> None:
    """Some architecture's guards may not serialise: the step then compiles as a plain
    `torch.compile` (dynamo's eager backend here) and emits the same outputs, saying so."""

    def unsaveable(*args, **kwargs):
        raise torch._dynamo.exc.PackageError("a guard that cannot be serialised")

    monkeypatch.setattr(torch._dynamo.aot_compile, "aot_compile_fullgraph", unsaveable)
    eager = forwards(build_runner(models["target"], VOCAB, {"static": True}))
    runner = build_runner(models["target"], VOCAB, {"static": True, "compiled": True})
    step = PrecompiledStep(runner.backend.body, tmp_path, SYMBOLIC, backend="eager")
    runner.backend.step = step
    with caplog.at_level(logging.WARNING, logger=precompiled.__name__):
        outputs = forwards(runner)
    assert step.fallback is not None and "cannot be saved" in caplog.text
    assert not list(tmp_path.glob("*.graph"))
    for got, want in zip(outputs, eager, strict=True):
        torch.testing.assert_close(got, want)


def test_the_folder_changes_with_what_decides_the_graphs(models, monkeypatch) -> None:
    """The saved guards leave out objects' identities and globals: the step's folder name
    must change with the model's sizes and dtype, the hidden state handed out, packed
    linears, the device kind and the traced sources, and stay for a copy of the model."""
    target = models["target"]
    cpu = torch.device("cpu")
    base = step_identity(StaticBody(target, -1), cpu)
    assert step_identity(StaticBody(models["draft"], -1), cpu) == base  # other weights alone
    packed = copy.deepcopy(target)
    assert pack_linears(packed) > 0
    others = [
        StaticBody(target, 2),
        StaticBody(copy.deepcopy(target).to(torch.bfloat16), -1),
        StaticBody(build_tiny_model({"num_hidden_layers": 1}), -1),
        StaticBody(packed, -1),
    ]
    assert all(step_identity(body, cpu) != base for body in others)
    monkeypatch.setattr(compiled, "device_kind", lambda device: "cpu:another-isa")
    assert step_identity(StaticBody(target, -1), cpu) != base
    monkeypatch.undo()
    monkeypatch.setattr(compiled, "TRACED", (*compiled.TRACED, "sprinter_train.core.io"))
    assert step_identity(StaticBody(target, -1), cpu) != base


@pytest.mark.heavy  # dynamo traces the trio's graphs (aot_eager), twice over the methods
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLING], ids=["greedy", "sampled"])
def test_a_compiled_engine_with_a_folder_emits_the_eager_tokens_run_after_run(
    models, tmp_path, later_process, monkeypatch, sampling
) -> None:
    """With a compile-cache folder in use, a compiled engine's runners are saved steps: they
    emit the eager static layout's tokens for every kind of policy, and a later process
    emits them again from the saved graphs, compiling none."""
    monkeypatch.setattr(
        compiled, "PrecompiledStep", functools.partial(PrecompiledStep, backend="aot_eager")
    )
    cache = compile_cache.CompileCache(tmp_path)  # the layout's: the builder points at it
    parity = Sprinter(lambda e, b, r, step: (step.tokens % 2).float(), tau=0.5, max_run=5)
    policies = [
        TargetOnly(),
        SpeculativeDecoding(gamma=3),
        SVIP(h=0.25, max_gamma=4, c=0.15),
        SpecVerification(ATable(), max_gamma=4),
        parity,
    ]

    def tokens(layout: dict[str, object]) -> tuple[list, dict[str, ModelRunner]]:
        engine = engine_for(models, sampling, layout=layout)
        out = [[r.tokens for r in engine.generate(PROMPTS[:2], p, NEW_TOKENS)] for p in policies]
        return out, engine.present_runners

    eager, _ = tokens({"static": True})
    first, runners = tokens({"static": True, "compiled": True, "compile_cache": cache})
    steps = [r.backend.step for r in runners.values()]
    assert all(isinstance(s, PrecompiledStep) for s in steps)
    assert first == eager and sum(s.compiled for s in steps) > 0
    later_process()
    again, runners = tokens({"static": True, "compiled": True, "compile_cache": cache})
    assert again == eager
    assert sum(r.backend.step.compiled for r in runners.values()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLING], ids=["greedy", "sampled"])
def test_on_cuda_saved_steps_replay_captured_with_the_dynamic_tokens(
    tmp_path, later_process, monkeypatch, sampling
) -> None:
    """The GPU's default layout (compiled, captured by hand) with a compile-cache folder in
    use: inductor's graphs saved, then loaded by a later process and captured again, emit
    the dynamic layout's tokens on the same GPU (float32), the second run compiling none."""
    cuda = {role: model.to("cuda") for role, model in tiny_trio().items()}
    layout = {
        "static": True,
        "compiled": True,
        "compile_cache": compile_cache.CompileCache(tmp_path),
    }
    policies = [TargetOnly(), SpeculativeDecoding(gamma=3), SVIP(h=0.25, max_gamma=4, c=0.15)]
    expected = engine_for(cuda, sampling)
    want = [[r.tokens for r in expected.generate(PROMPTS, p, NEW_TOKENS)] for p in policies]
    for run in range(2):
        engine = engine_for(cuda, sampling, layout=layout)
        got = [[r.tokens for r in engine.generate(PROMPTS, p, NEW_TOKENS)] for p in policies]
        assert got == want, run
        runners = engine.present_runners.values()
        assert all(r.layout == "compiled:captured" for r in runners)
        steps = [r.backend.static.step for r in runners]
        assert all(isinstance(s, PrecompiledStep) for s in steps)
        assert (sum(s.compiled for s in steps) == 0) == (run == 1)
        later_process()
