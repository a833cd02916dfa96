"""The smoke subset is a strict subset of the slow tests, so `make test-full` runs more than CI."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def marked(mark: str) -> set[str]:
    """file::test of every test function decorated with @pytest.mark.<mark>."""
    found = set()
    for path in sorted(TESTS.glob("test_*.py")):
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
