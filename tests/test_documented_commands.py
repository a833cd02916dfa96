"""Every command and override the docs and conf/ comments quote composes (Hydra's compose, no
run): a documented override that fails with "Key ... is not in struct" is a broken promise.

Commands are the `python -m sprinter_train ...` lines of conf/**/*.yaml comments and
docs/**/*.md (and README.md); bare overrides are the `key.path=value` spans quoted in those
comments and in the Markdown's backticks. Placeholders (`<exp>`, `...`) are left out; a sweep
(`-m ... a=1,2`) composes once per value.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from sprinter_train.core.config import compose_config

ROOT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"python -m sprinter_train\s+(.*)")
# a dotted key (or a `+`/`++`/`~` addition) and its `=`; the value is read by `value_at`
KEY = re.compile(r"(?<![\w./<-])(?:\+\+|\+|~)?([a-z_]\w*)(?:\.[\w]+)+=")
CLOSE = {"[": "]", "{": "}", "'": "'", '"': '"'}
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|…")
STAND_INS = {"<exp>": "x", "<other_exp>": "y", "<name>": "x", "methods.<m>.": "methods.sprinter."}
CODE = re.compile(r"`([^`]+)`")


def sources() -> list[Path]:
    return [
        *sorted((ROOT / "conf").rglob("*.yaml")),
        *sorted((ROOT / "docs").rglob("*.md")),
        ROOT / "README.md",
    ]


def comment_lines(path: Path) -> Iterator[str]:
    """A YAML file's comments; a Markdown file's lines, a `\\` continuation joined."""
    text = path.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if path.suffix == ".yaml":
            if "#" in line:
                yield line[line.index("#") + 1 :]
        else:
            yield line


def stand_in(text: str) -> str:
    """`text` with the placeholders that stand for any name filled in."""
    for placeholder, value in STAND_INS.items():
        text = text.replace(placeholder, value)
    return text


def command_overrides(text: str) -> list[str] | None:
    """The overrides of one `python -m sprinter_train` command (None: it holds a placeholder
    or is not a command)."""
    found = COMMAND.search(text)
    if not found:
        return None
    rest = re.split(r"\s(?:\||&&|;|#)\s|`|\s{3,}\(", found.group(1))[0]
    try:
        tokens = shlex.split(rest)
    except ValueError:
        return None
    overrides = []
    for token in tokens:
        if token.startswith("-"):
            continue  # -m, --multirun, --cfg ...
        if re.match(r"\[[+~]*[a-z_][\w.]*=", token) and token.endswith("]"):
            token = token[1:-1]  # an optional part: [key=[a, b]]
        for opener, closer in ("[]", "()"):  # an optional part: [key=value other=value]
            while token.startswith(opener) and token.count(opener) > token.count(closer):
                token = token[1:]
            while token.endswith(closer) and token.count(closer) > token.count(opener):
                token = token[:-1]
        if "=" not in token:
            break  # prose after the command
        token = stand_in(token)
        if PLACEHOLDER.search(token):
            return None
        overrides.append(token)
    return overrides


def value_at(text: str, start: int) -> str:
    """The override value beginning at `start`: quoted, a bracketed list or dict (spaces
    inside), else up to a space, a backtick or punctuation that ends a sentence."""
    if start < len(text) and text[start] in CLOSE:
        depth, opener = 0, text[start]
        for end in range(start, len(text)):
            if text[end] == opener and (opener not in "'\"" or end == start):
                depth += 1
            elif text[end] == CLOSE[opener]:
                depth -= 1
                if depth == 0:
                    return text[start : end + 1]
        return text[start:]
    found = re.match(r"[^\s`,;()]*", text[start:])
    return (found.group() if found else "").rstrip(".:")


def bare_overrides(line: str, markdown: bool, top: frozenset[str] = frozenset()) -> list[str]:
    """The `key.path=value` overrides a line quotes outside a command, those whose first
    segment is a key of the config (`top`; empty: any) being overrides, not prose about a
    relative key."""
    spans = [m.group(1) for m in CODE.finditer(line)] if markdown else [line]
    found = []
    for span in spans:
        if COMMAND.search(span):
            continue
        span = stand_in(span)
        for match in KEY.finditer(span):
            if top and match.group(1) not in top:
                continue
            text = match.group() + value_at(span, match.end())
            if not PLACEHOLDER.search(text):
                found.append(text.replace("'", "").replace('"', "") if "'{" in text else text)
    return found


def documented() -> list[tuple[str, tuple[str, ...]]]:
    """(where, overrides) for every command and bare override quoted, each once."""
    top = frozenset(compose_config().keys())
    seen: dict[tuple[str, ...], str] = {}
    for path in sources():
        where = str(path.relative_to(ROOT))
        for number, line in enumerate(comment_lines(path), 1):
            command = command_overrides(line)
            if command:
                seen.setdefault(tuple(command), f"{where}:{number}")
            elif command is None and not COMMAND.search(line):
                for override in bare_overrides(line, path.suffix == ".md", top):
                    seen.setdefault((override,), f"{where}:{number}")
    return [(where, overrides) for overrides, where in seen.items()]


def expand(overrides: tuple[str, ...]) -> list[list[str]]:
    """One list of overrides per value of a sweep (`a=1,2` -> a=1, a=2); the others as they
    are."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    runs: list[list[str]] = [[]]
    for text, override in zip(overrides, parsed, strict=True):
        if override.is_sweep_override():
            key = override.get_key_element()
            values = list(override.sweep_string_iterator())
            runs = [run + [f"{key}={v}"] for run in runs for v in values]
        else:
            runs = [run + [text] for run in runs]
    return runs


def compose_problem(overrides: tuple[str, ...]) -> str | None:
    """Why the overrides do not compose (None: each sweep value composes)."""
    try:
        for run in expand(overrides):
            compose_config(*run)
    except Exception as error:  # noqa: BLE001 - any composition error is the finding
        cause = f" ({error.__cause__})" if error.__cause__ else ""
        return f"{type(error).__name__}: {' '.join(str(error).split())}{cause}"
    return None


DOCUMENTED = documented()


def test_the_docs_quote_commands_and_overrides() -> None:
    """The extraction finds what the docs hold (else the test below checks nothing)."""
    quoted = {o for _, overrides in DOCUMENTED for o in overrides}
    assert len(DOCUMENTED) > 50
    assert "methods.sprinter.verifier.lam=1.5" in quoted  # conf/methods/sprinter.yaml's command
    # the sprinter.yaml comment of issue 39 item 11, now with its `++`
    assert "++methods.sprinter.verifier={kind: online, warmup_score: 0.0, positions: 1}" in quoted


@pytest.mark.parametrize(("where", "overrides"), DOCUMENTED, ids=[w for w, _ in DOCUMENTED])
def test_every_documented_command_composes(where: str, overrides: tuple[str, ...]) -> None:
    problem = compose_problem(overrides)
    assert problem is None, f"{where}: {' '.join(overrides)}: {problem}"


def test_an_override_not_in_struct_fails_the_check(tmp_path: Path) -> None:
    """Test of the test: issue 39 item 11's two overrides as they were documented (without
    `++`) are found in a comment and in Markdown and do not compose."""
    yaml_line = "# online: methods.sprinter.verifier='{kind: online, positions: 8}'"
    markdown = (
        "train it with `train.head=mlp` and bench it with `methods.sprinter.verifier.head=mlp`"
    )
    assert bare_overrides(yaml_line[1:], markdown=False) == [
        "methods.sprinter.verifier={kind: online, positions: 8}"
    ]
    found = bare_overrides(markdown, markdown=True)
    assert found == ["train.head=mlp", "methods.sprinter.verifier.head=mlp"]
    assert compose_problem((found[0],)) is None
    assert "not in struct" in (compose_problem((found[1],)) or "")
    assert compose_problem(("methods.sprinter.verifier={kind: online, positions: 8}",))
    assert compose_problem(("-m", "bench.gamma_max=1,2")[1:]) is None  # a sweep, each value
    line = "python -m sprinter_train stage=bench experiment=<exp> [bench.gamma_max=3]"
    assert command_overrides(line) == ["stage=bench", "experiment=x", "bench.gamma_max=3"]
    assert command_overrides("python -m sprinter_train stage=bench models=<name...>") is None
