"""The package's own modules for an export folder: the import closure of its entry module,
copied flat into custom_generate/ with their `sprinter_train` imports made relative.

transformers loads a custom_generate/ folder by copying generate.py and, recursively, every
file that a `from .<name> import ...` line names, from that one folder
(`dynamic_module_utils.get_relative_import_files`: one dot, one file per name, no
subfolders). So each module of the closure becomes one file there, named by its path under
sprinter_train with `__` between the parts (decoding/engine.py -> decoding__engine.py, a
package's __init__.py -> the package's name), and `from sprinter_train.decoding.engine import
Engine` (or the relative form) becomes `from .decoding__engine import Engine`. Nothing else in a
file changes.

The closure is what importing the entry runs: the imports at a module's top level (and in its
top-level if/try/with/class blocks), not those inside a function, which run only when it is
called. An import inside a function is rewritten as well when its module is in the closure,
and otherwise left to name sprinter_train (what the folder never calls, such as the latency
profile's measuring). `if TYPE_CHECKING:` blocks are left alone. The folder's requirements are torch,
transformers, safetensors and numpy: a closure that imports any other third-party package at
import time is refused, naming the chain of imports that reaches it, as is an import the flat
layout cannot carry (`import sprinter_train.x`, or a module imported by name from its package).
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "sprinter_train"
ROOT = Path(__file__).resolve().parents[1]  # sprinter_train/
REQUIRED = ("torch", "transformers", "safetensors", "numpy")  # the folder's requirements.txt
FROM = re.compile(r"from\s+(\.*[\w.]*)\s+import\b")


class VendorError(ValueError):
    """The entry's closure cannot run in an export folder (a heavy import, a layout the flat
    folder cannot carry); the message says which module and how it was reached."""


@dataclass(frozen=True)
class Vendored:
    """One module of the closure: its source file and its text in the folder."""

    module: str  # sprinter_train.decoding.engine
    source: Path
    text: str

    @property
    def name(self) -> str:
        """Its file name in the folder."""
        return flat_name(self.module) + ".py"


@dataclass(frozen=True)
class Found:
    """An import statement of a module: where it is and what it names."""

    node: ast.Import | ast.ImportFrom
    target: str  # the absolute module it imports from ("" for a plain import)
    top_level: bool  # runs when the module is imported


def flat_name(module: str) -> str:
    """decoding__engine for sprinter_train.decoding.engine."""
    return "__".join(module.split(".")[1:])


def source_of(module: str) -> Path | None:
    """The file of a sprinter_train module (a package's __init__.py), None if there is none."""
    parts = module.split(".")[1:]
    base = ROOT.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if parts and path.is_file():
            return path
    return None


def is_package(module: str) -> bool:
    path = source_of(module)
    return path is not None and path.name == "__init__.py"


def imports(module: str, tree: ast.Module) -> Iterator[Found]:
    """Every import statement of `module`'s tree, with its absolute target."""
    package = module if is_package(module) else module.rpartition(".")[0]

    def found(node: ast.Import | ast.ImportFrom, top: bool) -> Found:
        if isinstance(node, ast.Import):
            return Found(node, "", top)
        target = node.module or ""
        if node.level:
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        return Found(node, target, top)

    def walk(nodes: list[ast.AST], top: bool) -> Iterator[Found]:
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield found(node, top)
            elif isinstance(node, ast.If) and _type_checking(node.test):
                yield from walk(list(node.orelse), top)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = ast.walk(node)
                yield from (
                    found(n, False) for n in inner if isinstance(n, ast.Import | ast.ImportFrom)
                )
            else:
                yield from walk(
                    [n for n in ast.iter_child_nodes(node) if not isinstance(n, ast.expr)], top
                )

    yield from walk(list(tree.body), True)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def closure(entries: Sequence[str]) -> dict[str, Vendored]:
    """The modules importing `entries` runs, each with its folder text; refuses (VendorError)
    what cannot run from the flat folder with the folder's requirements."""
    trees: dict[str, tuple[Path, str, list[Found]]] = {}
    via: dict[str, str | None] = dict.fromkeys(entries)
    todo = list(entries)
    while todo:
        module = todo.pop()
        if module in trees:
            continue
        path = source_of(module)
        if path is None:
            raise VendorError(f"{module} is not a module of {PACKAGE}{_chain(via, module)}")
        text = path.read_text()
        found = list(imports(module, ast.parse(text)))
        trees[module] = (path, text, found)
        for item in found:
            for target in _dependencies(module, item, via):
                if target not in via:
                    via[target] = module
                todo.append(target)
    inside = set(trees)
    vendored = {}
    for module, (path, text, found) in sorted(trees.items()):
        vendored[module] = Vendored(module, path, rewrite(text, found, inside))
    names = [v.name for v in vendored.values()]
    clashes = sorted({n for n in names if names.count(n) > 1} | ({*names} & RESERVED))
    if clashes:
        raise VendorError(f"modules of the closure would share the folder's file names {clashes}")
    return vendored


RESERVED = frozenset({"generate.py", "exported_files.py"})  # the folder's own files


def _dependencies(module: str, item: Found, via: dict[str, str | None]) -> list[str]:
    """The sprinter_train modules an import statement brings into the closure (its top-level
    ones; a function's are followed only if the closure has them anyway), refusing a
    third-party package outside the requirements and a form the flat folder cannot carry."""
    node = item.node
    where = f"{source_of(module).relative_to(ROOT.parent)}:{node.lineno}"  # type: ignore[union-attr]
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
        ours = [n for n in names if n.split(".")[0] == PACKAGE]
        if ours:
            raise VendorError(
                f"{where} imports {ours[0]} as a module (`import {ours[0]}`); an export folder "
                f"is flat: import the names it uses (`from {ours[0]} import ...`)"
                f"{_chain(via, module)}"
            )
        if item.top_level:
            for name in names:
                _check_third_party(name, where, via, module)
        return []
    if item.target.split(".")[0] != PACKAGE:
        if item.top_level and node.level == 0:
            _check_third_party(item.target, where, via, module)
        return []
    if item.target == PACKAGE:
        raise VendorError(
            f"{where} imports from {PACKAGE}/__init__.py, which an export folder does not "
            f"carry{_chain(via, module)}"
        )
    if any(source_of(f"{item.target}.{a.name}") for a in node.names):
        raise VendorError(
            f"{where} imports a module by name from its package (`from {item.target} import "
            f"{', '.join(a.name for a in node.names)}`); transformers copies only files named "
            f"by `from .<module> import <name>`: import the names it uses from the module"
            f"{_chain(via, module)}"
        )
    return [item.target] if item.top_level else []


def _check_third_party(name: str, where: str, via: dict[str, str | None], module: str) -> None:
    top = name.split(".")[0]
    if top in sys.stdlib_module_names or top in REQUIRED:
        return
    raise VendorError(
        f"{where} imports {top} when it is imported; an export folder requires only "
        f"{', '.join(REQUIRED)} (requirements.txt){_chain(via, module)}. Import it inside the "
        "function that needs it, or move what the folder needs out of that module"
    )


def _chain(via: dict[str, str | None], module: str) -> str:
    """', reached by a -> b -> module' (the imports that brought `module` into the closure)."""
    chain = [module]
    while via.get(chain[-1]) is not None:
        chain.append(via[chain[-1]])  # type: ignore[arg-type]
    return "" if len(chain) == 1 else f", reached by {' -> '.join(reversed(chain))}"


def rewrite(text: str, found: list[Found], inside: set[str]) -> str:
    """`text` with each import of a closure module made relative to the flat folder (and a
    relative one of a module outside it, in a function, made absolute: in the folder it
    would name a file that is not there)."""
    lines = text.splitlines(keepends=True)
    for item in found:
        node = item.node
        if isinstance(node, ast.Import) or item.target.split(".")[0] != PACKAGE:
            continue
        if item.target in inside:
            module = "." + flat_name(item.target)
        elif node.level:
            module = item.target
        else:
            continue
        row = node.lineno - 1
        line = lines[row]
        match = FROM.match(line, node.col_offset)
        if match is None:
            raise VendorError(f"cannot rewrite the import on line {node.lineno}: {line.strip()}")
        start, end = match.span(1)
        lines[row] = line[:start] + module + line[end:]
    return "".join(lines)


def vendor(entries: Sequence[str], folder: Path) -> list[Vendored]:
    """Write the closure of `entries` into `folder`; returns what was written."""
    written = list(closure(entries).values())
    for module in written:
        (folder / module.name).write_text(module.text)
    return written
