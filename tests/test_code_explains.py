"""Code explains, results narrate: no docstring or comment in `sprinter_train/` or
`benchmarks/*.py`, no comment in `conf/`, and no line of docs/architecture.md quotes a
measured figure, an approximate one or the history of the work.

A measurement belongs on a docs/results/ page, beside the run that made it; a docstring may
say why a choice was made and link that page. The scan reads docstrings with `ast` and
comments with `tokenize` (yaml comments: the text after `#`; architecture.md: every line),
and flags:

- figures: a number with a unit of time (ns, us, ms, s, min, h), of size (KB, MB, GB, KiB,
  MiB, GiB), a ratio written `1.17x` or `1.17×`, a percentage, or a rate (tokens/s, it/s);
- approximate figures: `~` or `≈` before a number (`~0.49`, `~1/4`, `~1M`): a figure someone
  estimated or once measured, with neither the run nor the machine beside it (`~/.cache` is a
  path, not a figure);
- history: `session`, `lease`, machine names (H100, H200, A100, EPYC, Xeon, `2-core`), an
  issue's number, `used to`, `no longer`, `previously`, `formerly`, `was once`, `before this
  <change>`, `we measured`, and `measured on/in` a machine, session or lease. `was` and
  `measured` alone are not flagged: code that measures says so ("the batch sizes measured",
  "a predictor was fitted on"); only their narrative forms are.

`ALLOWED` is the reviewed list of what may stay: constants explained (a default, a split, a
paper's quoted figure), each with its reason. An entry no longer found fails too, so the
list stays as small as the code needs.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_UNIT = (
    r"(?:ns|us|µs|ms|s|sec|secs|seconds?|min|mins|minutes?|h|hours?"
    r"|KB|MB|GB|TB|KiB|MiB|GiB|kJ|%|tokens/s|tok/s|it/s)"
)
FIGURE = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:\s?" + _UNIT + r"(?![\w/])|[x×](?![\w]))")
APPROX = re.compile(r"(?<![\w/])[~≈]\s?\d[\d,]*(?:\.\d+)?(?:/\d+)?(?:[kKMGB](?![\w]))?")
HISTORY = re.compile(
    r"\bsessions?\b|\bleases?d?\b|\b[HA]100\b|\bH200\b|\bEPYC\b|\bXeon\b|\b(?:2|two)-core\b"
    r"|\bissue \d+|\bused to\b|\bno longer\b|\bpreviously\b|\bformerly\b|\bwas once\b"
    r"|\bbefore this (?:change|commit|refactor|work|fix)\b|\b(?:we|I) measured\b"
    r"|\bmeasured (?:on|in) (?:an? |the |that )?(?:[HA]\d+|EPYC|Xeon|session|lease|\d)",
    re.IGNORECASE,
)

# (file relative to the repository, the flagged text, why it may stay)
ALLOWED: list[tuple[str, str, str]] = [
    ("sprinter_train/data/online.py", "30%", "SPRINTER §4's own words, quoted"),
    ("sprinter_train/data/exchanges.py", "10%", "a split size: a design constant"),
    (
        "sprinter_train/decoding/policies/sv.py",
        "no longer",
        "maths: a verified x_j is no longer distributed as q_j",
    ),
    ("conf/data/lm1b.yaml", "30%", "SPRINTER's prefix rule: a setting"),
    ("conf/data/wiki_summary.yaml", "30%", "the same prefix rule: a setting"),
    ("conf/distill/default.yaml", "40 MB", "the size the factorised embedding aims under"),
    (
        "sprinter_train/bench/timing/energy.py",
        "262 kJ",
        "RAPL's counter range: a hardware constant",
    ),
    ("sprinter_train/bench/timing/energy.py", "40 minutes", "that range's wrap period at 100 W"),
    ("sprinter_train/data/sharegpt.py", "125 MB", "where the packaged JSON is cut: a fact of it"),
    (
        "sprinter_train/data/exchanges.py",
        "~16",
        "HumanEval's size times the split fraction: arithmetic on the data set, not a run",
    ),
    (
        "benchmarks/gpu_stage.py",
        "lease",
        "the device loan the script stages for, and its `.lease/` folder: its subject",
    ),
]


def offenders_in(text: str) -> list[str]:
    """The figures and history words one docstring line or comment holds."""
    return (
        [m.group(0) for m in FIGURE.finditer(text)]
        + [m.group(0) for m in APPROX.finditer(text)]
        + [m.group(0) for m in HISTORY.finditer(text)]
    )


def python_texts(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every docstring line and comment of a module's source."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                first = node.body[0].lineno
                for i, line in enumerate(doc.splitlines()):
                    yield first + i, line
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def yaml_texts(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment of a yaml file (a `#` that opens the line or follows a
    space)."""
    for number, line in enumerate(source.splitlines(), 1):
        match = re.search(r"(?:^|\s)#(.*)$", line)
        if match:
            yield number, match.group(1)


def markdown_texts(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every line of a markdown page: prose, tables and diagrams alike."""
    yield from enumerate(source.splitlines(), 1)


def scan(path: Path, source: str) -> list[tuple[int, str, str]]:
    """(line, flagged text, the line) for each offender in one file."""
    if path.suffix == ".py":
        texts = python_texts(source)
    elif path.suffix == ".md":
        texts = markdown_texts(source)
    else:
        texts = yaml_texts(source)
    return [(n, hit, text.strip()) for n, text in texts for hit in offenders_in(text)]


def files() -> list[Path]:
    """What the scan reads: the package's modules, the benchmark scripts, the configs and the
    architecture page (docs/results/ is where figures and history belong, so it is not read)."""
    return (
        sorted((ROOT / "sprinter_train").rglob("*.py"))
        + sorted((ROOT / "benchmarks").glob("*.py"))
        + sorted((ROOT / "conf").rglob("*.yaml"))
        + [ROOT / "docs" / "architecture.md"]
    )


def test_no_docstring_or_comment_quotes_a_figure_or_the_history_of_the_work() -> None:
    allowed = {(path, text) for path, text, _ in ALLOWED}
    used: set[tuple[str, str]] = set()
    found = []
    for path in files():
        rel = path.relative_to(ROOT).as_posix()
        for line, hit, text in scan(path, path.read_text()):
            if (rel, hit) in allowed:
                used.add((rel, hit))
                continue
            found.append(f"{rel}:{line}: {hit!r} in: {text}")
    assert not found, (
        "move these measurements or this history to a docs/results/ page and leave the why "
        "(with a link) here:\n" + "\n".join(found)
    )
    assert allowed <= used, f"allow-list entries no longer found: {sorted(allowed - used)}"


def test_the_scan_catches_a_figure_and_history_in_a_synthetic_module() -> None:
    source = '''
"""Packing the linears. On the 2-core CPU a step took 25 ms against 31.5 ms (1.24x)."""

def step():
    """Used to copy 24 MB a round; 12% of the time."""
    x = 1  # measured on an H100 in session 16 (issue 23): 3.46 ms
    return x  # the default that explains itself: one row
'''
    hits = [hit for _, hit, _ in scan(Path("synthetic.py"), source)]
    for figure in ("25 ms", "31.5 ms", "1.24x", "24 MB", "12%", "3.46 ms"):
        assert figure in hits
    for word in ("2-core", "Used to", "measured on an H100", "session", "issue 23"):
        assert word in hits
    assert not [hit for line, hit, _ in scan(Path("s.py"), source) if line == 7]
    yaml = "compile: auto  # on for CUDA (a step: 3.46 ms against 21.9 eager, 0.99-1.23x)\n"
    assert [hit for _, hit, _ in scan(Path("c.yaml"), yaml)] == ["3.46 ms", "1.23x"]
    approx = (
        "gamma: 2  # fewer target calls at alpha ~0.49\n"
        "passes: 2  # a pass costs ~1/4 of the teacher's\n"
        "tokens: 4000000  # a GPU makes ~1M a minute; adds ≈ 0.6 of a fit\n"
        "cache_dir: ~/.cache/x  # a path, not a figure\n"
    )
    assert [hit for _, hit, _ in scan(Path("a.yaml"), approx)] == ["~0.49", "~1/4", "~1M", "≈ 0.6"]
    page = "# Layers\n\nThe H100 run of session 16 made a step 2.10 ms (~0.6 of eager).\n"
    assert [hit for _, hit, _ in scan(Path("architecture.md"), page)] == [
        "2.10 ms",
        "~0.6",
        "H100",
        "session",
    ]


def test_the_scan_reads_conf_benchmarks_and_the_architecture_page() -> None:
    rels = {path.relative_to(ROOT).as_posix() for path in files()}
    assert "docs/architecture.md" in rels
    assert any(rel.startswith("benchmarks/") and rel.endswith(".py") for rel in rels)
    assert any(rel.startswith("conf/") for rel in rels)


def test_the_scan_leaves_code_and_plain_numbers_alone() -> None:
    source = '''
"""Round the capacity up to a multiple of 128; a row bucket holds at most 64 rows.

The top-p cut keeps tokens until their mass reaches p (SPRINTER eq. 3)."""

LIMIT_S = 1.5  # seconds a lock waits before it reads the holder
'''
    assert scan(Path("clean.py"), source) == []
