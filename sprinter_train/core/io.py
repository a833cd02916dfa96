"""Atomic file writes and JSON sidecars: a stage never leaves a half-written artifact."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sprinter_train.core.processes import pid_alive

log = logging.getLogger(__name__)

TEMP_NAME = re.compile(r"^\..+\.tmp(\d+)$")  # atomic_write's temporary file: .<name>.tmp<pid>


def atomic_write(path: Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` then rename tmp to `path`, so readers see a whole file or none."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def temp_path(path: Path) -> Path:
    """Where `atomic_write` (and a writer that moves several files into place) writes aside."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sweep_stale_temps(folder: Path) -> list[Path]:
    """Delete the temporary files `atomic_write` left in `folder` when its writer was killed,
    only those whose writer pid is gone (a live writer's file is never touched)."""
    removed = []
    for path in sorted(Path(folder).glob(".*.tmp*")):
        match = TEMP_NAME.match(path.name)
        if match and path.is_file() and not pid_alive(int(match.group(1))):
            path.unlink(missing_ok=True)
            removed.append(path)
    if removed:
        log.info("removed %d temporary files of killed writers from %s", len(removed), folder)
    return removed


def json_text(payload: Any) -> str:
    """The one JSON layout every artifact is written in (sorted keys, indented)."""
    return json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n"


def write_json(path: Path, payload: Any) -> Path:
    def _write(tmp: Path) -> None:
        tmp.write_text(json_text(payload))

    return atomic_write(path, _write)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


class MissingInputError(FileNotFoundError):
    """A stage's input does not exist; the message names the stage that makes it."""


class CorruptInputError(ValueError):
    """An input file exists but is not what it should be; the message names the file and the
    stage that rewrites it."""


def corrupt_input(path: Path, problem: object, remedy: str) -> CorruptInputError:
    return CorruptInputError(f"{path} is corrupt or unreadable ({problem}); {remedy}")


def read_json_input(path: Path, remedy: str, keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """A JSON object another stage wrote, with these top-level keys; anything else is a
    CorruptInputError naming the file and `remedy` (the command that rewrites it)."""
    try:
        payload = read_json(path)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise corrupt_input(path, error, remedy) from error
    if not isinstance(payload, dict):
        raise corrupt_input(path, f"a JSON {type(payload).__name__}, not an object", remedy)
    missing = [key for key in keys if key not in payload]
    if missing:
        raise corrupt_input(path, f"no {', '.join(missing)}", remedy)
    return payload


def save_npz(path: Path, **arrays: np.ndarray) -> Path:
    def _write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            np.savez(handle, **arrays)

    return atomic_write(path, _write)


def load_npz(path: Path) -> dict[str, np.ndarray] | None:
    """Load a shard; a truncated or corrupt one returns None so the caller redoes it."""
    try:
        with np.load(path) as data:
            return {key: data[key] for key in data.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
        return None
