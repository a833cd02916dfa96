"""A lock file naming the processes that write a folder: one live writer at a time.

The file holds the host and each process's pid and start time. Another writer fails at once
with a message naming them; a lock whose processes are all gone (killed, even by SIGKILL) is
stale and taken over, so a crash never needs a manual clean-up.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sprinter_train.core.processes import pid_alive, start_time

log = logging.getLogger(__name__)


class LockHeldError(RuntimeError):
    """Another live process holds the lock; the message names it."""


def _entry(pid: int) -> dict[str, Any]:
    return {"pid": pid, "started": start_time(pid)}


def read_lock(path: Path) -> dict[str, Any] | None:
    """The lock's contents, or None when it is missing or unreadable (a writer killed mid-way)."""
    try:
        payload = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) and "processes" in payload else None


def live_holders(payload: dict[str, Any] | None) -> list[int]:
    """Pids of the lock's processes that still run; on another host every pid counts as live
    (this machine cannot tell), so that lock is never taken over silently."""
    if payload is None:
        return []
    entries = payload.get("processes", [])
    if payload.get("host") != socket.gethostname():
        return [int(e["pid"]) for e in entries]
    return [int(e["pid"]) for e in entries if pid_alive(int(e["pid"]), e.get("started"))]


def _write_new(path: Path, payload: dict[str, Any]) -> bool:
    """Create `path` with `payload` in one step (written aside, then hard-linked): False if it
    exists. Readers never see a half-written lock."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


def acquire(path: Path, what: str) -> None:
    """Take the lock for this process or fail naming the live holder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"host": socket.gethostname(), "processes": [_entry(os.getpid())], "what": what}
    for _ in range(3):
        if _write_new(path, payload):
            return
        seen = _inode(path)
        holder = read_lock(path)
        live = live_holders(holder)
        if live:
            host = (holder or {}).get("host")
            raise LockHeldError(
                f"{what} is in use by process {', '.join(map(str, live))} on {host} (lock file "
                f"{path}). Wait for it to finish or stop it; a lock whose processes are gone is "
                "taken over by the next run."
            )
        if _inode(path) == seen:  # not replaced meanwhile by a run that took it over first
            log.warning("taking over the stale lock %s (its processes are gone)", path)
            path.unlink(missing_ok=True)
    raise LockHeldError(f"could not take the lock {path} for {what}: another run keeps taking it")


def add_process(path: Path, pid: int) -> None:
    """Name a helper process (e.g. a background teacher) in this process's lock: the lock stays
    held while the helper runs, even if this process is gone."""
    payload = read_lock(path)
    if payload is None or all(e["pid"] != os.getpid() for e in payload["processes"]):
        raise LockHeldError(f"{path} is not held by this process")
    payload["processes"].append(_entry(pid))
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


def release(path: Path) -> None:
    """Remove the lock if this process holds it."""
    payload = read_lock(path)
    if payload is not None and payload["processes"][0]["pid"] == os.getpid():
        Path(path).unlink(missing_ok=True)


@contextmanager
def held(path: Path, what: str) -> Iterator[Path]:
    """The lock for the duration of the block."""
    acquire(path, what)
    try:
        yield Path(path)
    finally:
        release(path)


WRITER = "writer.lock"  # artifacts/<exp>/writer.lock: one stage writes into an experiment at a time


def experiment_writer(experiment_dir: str | Path, stage: str) -> contextlib.AbstractContextManager:
    """The experiment's writer lock for a stage's whole run: a second stage writing into the
    same experiment (two trains interleaving metrics.csv, a train during a harvest) fails at
    once naming the holder."""
    return held(Path(experiment_dir) / WRITER, f"stage={stage} of the experiment {experiment_dir}")
