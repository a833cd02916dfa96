"""Shared fixtures: Hydra composition with CPU overrides and tmp_path artifacts, tiny models.

Real-model and other costly tests are marked `slow`. The default run (`make test`, CI) keeps
only the slow tests also marked `smoke`, a bounded subset chosen by cost; `--run-slow-all`
(`make test-full`) runs every slow test. A `smoke` test must be `slow` too. Tests marked
`gpu` run only where CUDA is available and are skipped elsewhere. `make test-quick` leaves out
`law` (20k-row statistical law tests), `slow` and `heavy` (other processes, whole stage
chains) tests; `make test` runs all three.

No test reads the machine: `_machine_readings` fixes the load, busy cores and usable cores
that stages choose their threads from and the bench judges its timings by.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sprinter_train.core import machine
from sprinter_train.core.config import compose_config


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow-all", action="store_true", help="run every slow real-model test")


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
