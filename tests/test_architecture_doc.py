"""docs/architecture.md names every module of `sprinter_train/`, and only modules that exist.

The package is read from disk when the test runs, so a module added, moved or split shows up
here at once: a module missing from the page's "Modules" tables fails, and so does a path the
page names (in its tables, its prose, its diagrams or its links) that no longer exists.

A module is named by its path inside the package (`decoding/runner/capture.py`); a package
by its folder (`decoding/runner/`, its `__init__.py`); the top level's own `__init__.py` and
`__main__.py` by their file names.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sprinter_train"
DOC = ROOT / "docs" / "architecture.md"

# first path components that make a backticked token a path in this repository
TOP_DIRS = ("sprinter_train", "conf", "tests", "benchmarks", "docs", "checkpoints", "notebooks")


def package_modules() -> set[str]:
    """Every module of the package as the page names it, read from disk now."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(PACKAGE)
        if path.name == "__init__.py" and rel.parent != Path("."):
            names.add(rel.parent.as_posix() + "/")
        else:
            names.add(rel.as_posix())
    return names


def subpackages() -> set[str]:
    """The first components a package path can start with (`core`, `decoding`, ...)."""
    return {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}


def modules_section(text: str) -> str:
    """The page's "## Modules" section, up to the next second-level heading."""
    match = re.search(r"^## Modules\n(.*?)(?=^## )", text, re.MULTILINE | re.DOTALL)
    assert match, f"{DOC.relative_to(ROOT)} has no '## Modules' section"
    return match.group(1)


def table_modules(section: str) -> list[str]:
    """The module each table row of the section names in its first cell."""
    return re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE)


def named_paths(text: str) -> set[str]:
    """Every backticked token of the page that names a path of this repository: a `.py` file,
    or a path whose first component is a top folder of the repository or a subpackage."""
    tops = set(TOP_DIRS) | subpackages()
    found = set()
    for token in re.findall(r"`([^`\n]+)`", text):
        if any(c in token for c in " <>=*[]()") or "..." in token:
            continue  # a command, an override, a placeholder or a pattern, not a path
        first = token.split("/", 1)[0]
        if token.endswith(".py") or ("/" in token and first in tops):
            found.add(token)
    return found


def resolves(token: str, basenames: set[str]) -> bool:
    """Whether a named path exists: from the repository root, from the package, or (a bare
    file name) as the name of some file under the package, tests/ or benchmarks/."""
    if "/" not in token:
        return token in basenames
    return (ROOT / token).exists() or (PACKAGE / token).exists()


def repo_basenames() -> set[str]:
    return {
        p.name
        for folder in ("sprinter_train", "tests", "benchmarks")
        for p in (ROOT / folder).rglob("*.py")
    }


def test_every_module_of_the_package_is_in_the_module_tables() -> None:
    listed = table_modules(modules_section(DOC.read_text()))
    on_disk = package_modules()
    missing = sorted(on_disk - set(listed))
    gone = sorted(set(listed) - on_disk)
    twice = sorted({m for m in listed if listed.count(m) > 1})
    assert not missing, "add a row to docs/architecture.md's module tables for each:\n" + "\n".join(
        missing
    )
    assert not gone, (
        "docs/architecture.md's module tables name modules that do not exist:\n" + "\n".join(gone)
    )
    assert not twice, f"listed more than once: {twice}"


def test_every_path_the_page_names_exists() -> None:
    text = DOC.read_text()
    basenames = repo_basenames()
    stale = sorted(t for t in named_paths(text) if not resolves(t, basenames))
    assert not stale, "docs/architecture.md names paths that do not exist:\n" + "\n".join(stale)


def test_every_link_of_the_page_resolves() -> None:
    text = DOC.read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (DOC.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    assert not broken, "docs/architecture.md links to files that do not exist:\n" + "\n".join(
        broken
    )


def test_the_checks_catch_a_missing_module_and_a_stale_path() -> None:
    page = (
        "## Modules\n\n| module | what |\n|---|---|\n| `decoding/engine.py` | x |\n"
        "| `decoding/graphs.py` | gone |\n\n## Next\n"
        "Prose naming `decoding/runner/capture.py`, `draft_graph.py` and `core/rules.py`.\n"
    )
    listed = set(table_modules(modules_section(page)))
    assert listed == {"decoding/engine.py", "decoding/graphs.py"}
    assert "decoding/runner/capture.py" in package_modules() - listed
    assert "decoding/graphs.py" in listed - package_modules()
    basenames = repo_basenames()
    stale = {t for t in named_paths(page) if not resolves(t, basenames)}
    assert stale == {"decoding/graphs.py", "draft_graph.py"}
