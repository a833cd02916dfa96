"""Imports point down the layer order written in sprinter_train's package docstring."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import sprinter_train

PACKAGE = Path(sprinter_train.__file__).parent


def layer_order() -> dict[str, int]:
    """Top-level package name -> layer index, from the docstring's indented list."""
    lines = [re.match(r"^    ([\w, ]+):", line) for line in sprinter_train.__doc__.splitlines()]
    units = [match.group(1).split(",") for match in lines if match]
    return {name.strip(): layer for layer, names in enumerate(units) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(module: str, source: str, is_package: bool = False) -> set[str]:
    """Absolute names of the package's modules `source` imports (relative imports resolved)."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            names.update(f"{name}.{a.name}" if not node.module else name for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return {n for n in names if n.split(".")[0] == "sprinter_train"}


def upward_imports(module: str, source: str, is_package: bool = False) -> list[str]:
    """`module -> imported` for each import of another unit at the same or a higher layer."""
    order = layer_order()
    unit = unit_of(module)
    found = []
    for imported in sorted(imported_modules(module, source, is_package)):
        target = unit_of(imported)
        if target not in (unit, "__init__") and order[target] >= order[unit]:
            found.append(f"{module} -> {imported}")
    return found


def unit_of(module: str) -> str:
    """The layered unit a module belongs to: its first package under sprinter_train."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_docstring_names_every_package_once() -> None:
    order = layer_order()
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages | {"__main__"} == set(order), "add new packages to the layer list"


def test_every_import_points_down_the_layer_order() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        if unit_of(module) != "__init__":
            upward += upward_imports(module, path.read_text(), path.name == "__init__.py")
    assert not upward, "imports that point up or across the layer order:\n" + "\n".join(upward)


def test_the_checker_reports_upward_and_sideways_imports() -> None:
    engine = "from sprinter_train.decoding.engine import Engine\n"
    assert upward_imports("sprinter_train.core.sampling", engine)
    assert upward_imports("sprinter_train.decoding.beam", "from ..bench import peer\n")
    assert upward_imports(
        "sprinter_train.bench.peers.hf_assisted", "import sprinter_train.evaluation.plots\n"
    )
    assert not upward_imports("sprinter_train.bench.peers.hf_assisted", engine)
    assert not upward_imports("sprinter_train.decoding.beam", "from .engine import Engine\n")


def test_no_test_module_imports_another() -> None:
    """Shared test code lives in helper modules (tests/*_helpers.py, synthetic.py): importing
    a test module runs its collection-time code twice and couples two suites."""
    tests = Path(__file__).parent
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            found += [f"{path.name} -> {n}" for n in names if n.split(".")[-1].startswith("test_")]
    assert not found, found


OLD_METHOD_LISTS = re.compile(
    r"\b(LAW_METHODS|BEST_LOSSLESS|LOSSLESS|VERIFIED|PLANNED)\s*(:[^=]*)?=\s*[(\[{]"
)


def test_no_list_of_methods_outside_the_registry() -> None:
    """Which methods are lossless, law-checked, exported or planned is declared once, in each
    method's traits (decoding/policies/registry.py reads them); a tuple of names beside would drift."""
    roots = [PACKAGE, PACKAGE.parent / "tests", PACKAGE.parent / "benchmarks"]
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for root in roots
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if OLD_METHOD_LISTS.search(line) and "OLD_METHOD_LISTS" not in line
    ]
    assert not found, "\n".join(found)
    assert OLD_METHOD_LISTS.search('LAW_METHODS = ("sv", "sv_paper")')  # the check can fail
