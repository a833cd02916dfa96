"""Atomic file writes and JSON sidecars: a stage never leaves a half-written artifact."""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def atomic_write(path: Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` then rename tmp to `path`, so readers see a whole file or none."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def write_json(path: Path, payload: Any) -> Path:
    def _write(tmp: Path) -> None:
        tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")

    return atomic_write(path, _write)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


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
