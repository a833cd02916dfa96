"""What a model is, by content: the sha256 of its weight and config bytes (never mtimes, which
a clone, checkout or `cp -r` changes on byte-identical files), and how two identities differ.

Hashing a GGUF of hundreds of MB takes seconds, so each file's digest is cached under the user cache dir
keyed by (resolved path, size, mtime_ns): a touched file costs one rehash, never a mismatch.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sprinter_train.core.io import file_sha256

DOCUMENT_SUFFIXES = (".md", ".png", ".jpg", ".jpeg", ".txt")  # a model card is not the model


def digest_cache_dir() -> Path:
    """$XDG_CACHE_HOME/sprinter_train/digests (~/.cache/... without it)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(root) / "sprinter_train" / "digests"


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes, read from the cache when its path, size and mtime_ns are the
    ones hashed (any change of them only rehashes: the digest itself is of the bytes)."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    key = hashlib.sha256(f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    entry = digest_cache_dir() / f"{key[:32]}.json"
    try:
        cached = json.loads(entry.read_text())
        if cached.get("path") == str(resolved) and isinstance(cached.get("sha256"), str):
            return cached["sha256"]
    except (OSError, ValueError, AttributeError):
        pass  # no entry, or a broken one: hash again
    digest = file_sha256(resolved)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        aside = entry.with_name(f".{entry.name}.tmp{os.getpid()}")
        aside.write_text(json.dumps({"path": str(resolved), "sha256": digest}))
        os.replace(aside, entry)
    except OSError:
        pass  # a read-only cache only costs the next run a rehash
    return digest


def model_files(resolved: Path, gguf_file: str | None) -> list[Path]:
    """The files that make a local model: its GGUF, or every file of its folder but its card
    and pictures (`draft_eval.update_model_card` rewrites the README)."""
    if gguf_file:
        return [resolved / gguf_file]
    if not resolved.is_dir():
        return []
    return sorted(
        f
        for f in resolved.iterdir()
        if f.is_file() and not f.name.lower().endswith(DOCUMENT_SUFFIXES)
    )


def content_digest(files: list[Path]) -> str | None:
    """sha256 (16 hex) over each file's name and content digest; None without files."""
    present = [f for f in files if f.exists()]
    if not present:
        return None
    parts = [f"{f.name}:{file_digest(f)}" for f in present]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def identity_differences(recorded: Mapping[str, Any], ours: Mapping[str, Any]) -> list[str]:
    """`field recorded (now: ours)` for every identity field that differs (one missing from
    an older artifact counts as differing: it cannot be shown to be the same)."""
    keys = sorted(set(recorded) | set(ours))
    return [
        f"{key} {recorded.get(key)!r} (now {ours.get(key)!r})"
        for key in keys
        if recorded.get(key) != ours.get(key)
    ]


def roles_differences(
    recorded: Mapping[str, Any], ours: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """`role field ...` for each role of `ours` whose recorded identity differs (a role the
    artifact did not record differs as a whole)."""
    out = []
    for role, identity in ours.items():
        theirs = recorded.get(role)
        if theirs is None:
            out.append(f"{role}: not recorded")
            continue
        out += [f"{role} {d}" for d in identity_differences(theirs, identity)]
    return out
