"""The smoke subset is a strict subset of the slow tests, so `make test-full` runs more than CI;
the quick set's per-test CPU budget fails a test over it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def marked(mark: str) -> set[str]:
    """file::test of every test function decorated with @pytest.mark.<mark>."""
    found = set()
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d).split("(")[0] == f"pytest.mark.{mark}" for d in node.decorator_list
            ):
                found.add(f"{path.name}::{node.name}")
    return found


def test_smoke_is_a_strict_subset_of_slow() -> None:
    slow, smoke = marked("slow"), marked("smoke")
    assert smoke, "CI would run no real-model test"
    assert smoke <= slow, f"smoke tests not marked slow: {sorted(smoke - slow)}"
    assert slow - smoke, "every slow test is smoke: --run-slow-all would add nothing"


BURNER = """
import time

import pytest


def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_quick_and_slow():
    burn(0.6)


@pytest.mark.heavy
def test_heavy_and_slow():
    burn(0.6)


def test_quick_and_cheap():
    pass


@pytest.mark.gpu
def test_gpu_and_slow():
    burn(0.6)
"""

# the burner's conftest: tests/conftest.py's, on a machine that says it has CUDA, so the gpu
# test runs here rather than being skipped
CONFTEST = """import torch

from tests.conftest import *  # noqa: F403

torch.cuda.is_available = lambda: True
"""


@pytest.mark.heavy  # another pytest process
def test_a_quick_test_over_its_cpu_budget_fails_and_a_heavy_or_gpu_one_does_not(tmp_path) -> None:
    """The budget of tests/conftest.py, run on four tests against a budget of 0.3 CPU s: a
    gpu test runs on a GPU machine alone, where compiling is what it checks."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_burn.py").write_text(BURNER)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "quick_test_cpu_seconds=0.3",
            "--strict-markers",
            "-o",
            "markers=heavy\n    gpu",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(TESTS.parent)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "1 failed, 3 passed" in done.stdout, done.stdout[-3000:]
    assert "test_quick_and_slow spent" in done.stdout
    assert "over the quick set's budget of 0.3 s" in done.stdout
