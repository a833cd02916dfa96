"""Shared fixtures: Hydra composition with CPU overrides and tmp_path artifacts, tiny models.

Real-model and other costly tests are marked `slow`. The default run (`make test`, CI) keeps
only the slow tests also marked `smoke`, a bounded subset chosen by cost; `--run-slow-all`
(`make test-full`) runs every slow test. A `smoke` test must be `slow` too. Tests marked
`gpu` run only where CUDA is available and are skipped elsewhere. `make test-quick` leaves out
`law` (20k-row statistical law tests), `slow` and `heavy` (other processes, whole stage
chains) tests; `make test` runs all three.

No test reads the machine: `_machine_readings` fixes the load, busy cores and usable cores
that stages choose their threads from and the bench judges its timings by.

transformers' deprecations are errors (`_transformers_deprecations`): each is the next
release's break, and most are logged (`logger.warning_once`), which pytest's filterwarnings
never sees.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import transformers

from sprinter_train.core import compile_cache, machine
from sprinter_train.core.config import compose_config


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow-all", action="store_true", help="run every slow real-model test")
    parser.addini(
        "quick_test_cpu_seconds",
        "CPU seconds a test of the quick set (not law, slow or heavy) may spend in its set-up "
        "and call; 0 turns the budget off",
        default="0",
    )


QUICK_EXCLUDES = ("law", "slow", "heavy")
_CPU_SPENT = pytest.StashKey[float]()


def in_quick_set(item: pytest.Item) -> bool:
    """Whether `make test-quick` runs this test (its marker expression, as a predicate)."""
    return not any(marker in item.keywords for marker in QUICK_EXCLUDES)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    began = time.process_time()
    yield
    item.stash[_CPU_SPENT] = time.process_time() - began


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    began = time.process_time()
    yield
    item.stash[_CPU_SPENT] = item.stash.get(_CPU_SPENT, 0.0) + time.process_time() - began


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A quick-set test over its CPU budget fails, so no slow test creeps into the inner
    loop unseen. CPU seconds of this process, not wall time: another job on a shared
    machine stretches the wall clock several times but leaves a test's own CPU time near
    its quiet value (module fixtures count in the first test that builds them)."""
    outcome = yield
    report = outcome.get_result()
    budget = float(item.config.getini("quick_test_cpu_seconds") or 0)
    if report.when != "call" or not report.passed or budget <= 0 or not in_quick_set(item):
        return
    if "gpu" in item.keywords:  # runs on a GPU machine only, where compiling is what it checks
        return
    spent = item.stash.get(_CPU_SPENT, 0.0)
    if spent > budget:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} spent {spent:.1f} CPU s in set-up and call, over the quick set's "
            f"budget of {budget:g} s (quick_test_cpu_seconds in pyproject.toml): make it "
            "smaller, share its fixture, or mark it heavy (docs/testing.md)"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = [
        item.nodeid for item in items if "smoke" in item.keywords and "slow" not in item.keywords
    ]
    if unmarked:
        raise pytest.UsageError(
            f"`smoke` picks among slow tests; mark these `slow` too: {unmarked}"
        )
    no_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
    if config.getoption("--run-slow-all"):
        return
    skip = pytest.mark.skip(
        reason="slow test outside the smoke subset: --run-slow-all (make test-full)"
    )
    for item in items:
        if "slow" in item.keywords and "smoke" not in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _compile_state() -> Iterator[None]:
    """What a test's compiled runners set process-wide is forgotten after it: torch's
    on-disk caches, where a stage's or a layout's compile cache pointed them (the builder
    does, `CompileCache.apply`: a later test's runners must not read what an earlier one
    saved there), and dynamo's symbolic sources (`compiled.compiled_step` adds its own; a
    later test may count the graphs a static first call compiles)."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    folder = os.environ.get(compile_cache.ENV)
    with (
        torch.compiler.config.patch(
            dynamic_sources=torch.compiler.config.dynamic_sources,
            job_id=torch.compiler.config.job_id,
        ),
        inductor_config.patch(fx_graph_cache=inductor_config.fx_graph_cache),
        functorch_config.patch(enable_autograd_cache=functorch_config.enable_autograd_cache),
    ):
        yield
    if folder is None:
        os.environ.pop(compile_cache.ENV, None)
    else:
        os.environ[compile_cache.ENV] = folder


@pytest.fixture(autouse=True)
def _small_torch() -> None:
    torch.set_num_threads(1)  # tiny models: more threads only oversubscribe a shared CPU


@pytest.fixture(autouse=True)
def _machine_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads the real machine: one idle usable core (so stages choose 1 thread, as
    `_small_torch` does), load 0. A test about the readings patches them again."""
    quiet = machine.quiet_machine(cores=1)
    monkeypatch.setattr(machine, "read_machine", lambda window_s=0.3: quiet)
    monkeypatch.setattr(machine, "usable_cores", lambda *a: quiet.cores)
    monkeypatch.setattr(machine, "load_average", lambda: quiet.load)
    monkeypatch.setattr(machine, "busy_cores", lambda *a, **k: quiet.busy)


TRANSFORMERS = str(Path(transformers.__file__).parent) + "/"
# deprecated calls transformers makes itself, which nothing of ours can avoid (file, why)
TRANSFORMERS_OWN = {
    "generation/candidate_generator.py": "assisted generation calls the assistant's generate "
    "with generation_config and min/max_new_tokens beside it (5.17-5.24)",
}
DEPRECATION = re.compile("deprecat", re.IGNORECASE)


class TransformersDeprecation(Exception):
    """A deprecated use of transformers, logged or warned by transformers."""


def refuse_deprecation(message: str) -> None:
    """Raise for a deprecation message of transformers' at the point it is issued, unless a
    frame of transformers' own deprecated calls is on the stack."""
    if not DEPRECATION.search(message):
        return
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(TRANSFORMERS) and name[len(TRANSFORMERS) :] in TRANSFORMERS_OWN:
            return
        frame = frame.f_back
    raise TransformersDeprecation(
        f"transformers: {message} (tests/conftest.py makes transformers' deprecations errors)"
    )


class _RaiseOnDeprecation(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        refuse_deprecation(record.getMessage())


@pytest.fixture(autouse=True)
def _transformers_deprecations(monkeypatch: pytest.MonkeyPatch):
    """transformers' deprecations, logged (any `transformers.*` logger) or warned (a
    FutureWarning or DeprecationWarning whose `warnings.warn` is in transformers), raise
    `TransformersDeprecation` where they are issued; nothing else's warnings change."""
    warn = warnings.warn
    kinds = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)

    def checked_warn(message, category=None, stacklevel=1, source=None, **kwargs):
        kind = category or (type(message) if isinstance(message, Warning) else UserWarning)
        if issubclass(kind, kinds) and sys._getframe(1).f_code.co_filename.startswith(TRANSFORMERS):
            refuse_deprecation(str(message))
        return warn(message, category, stacklevel + 1, source, **kwargs)

    monkeypatch.setattr(warnings, "warn", checked_warn)
    once = getattr(logging.Logger, "warning_once", None)  # transformers' once-a-process log
    if hasattr(once, "cache_clear"):
        once.cache_clear()  # so every test sees its own
    handler = _RaiseOnDeprecation(logging.WARNING)
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    yield
    logger.removeHandler(handler)


@pytest.fixture
def compose_cfg(tmp_path: Path):
    """Compose conf/config.yaml with overrides, artifacts under tmp_path, on CPU."""

    def _compose(*overrides: str):
        return compose_config(
            f"artifacts_root={tmp_path / 'artifacts'}", "device=cpu", "dtype=float32", *overrides
        )

    return _compose


@pytest.fixture
def sleeper():
    """A live process that is not this one (a writer still at work, a lock's holder)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield child
    child.kill()
    child.wait()
