"""Whether a process still runs, and how a helper process dies with the one that started it.

A lock or a temporary file is stale only once the process that made it is gone; a pid alone
is not enough (pids are reused, and a killed child stays a zombie until reaped), so liveness
also reads the process's state and start time from /proc where there is one.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3 onwards of /proc/<pid>/stat (state first), or None without /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def pid_alive(pid: int, started: int | None = None) -> bool:
    """True while `pid` runs on this machine (and, when `started` is given, is the process that
    started then); a zombie, dead but not yet reaped, counts as gone."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's live process
    fields = _stat_fields(pid)
    if fields is None:
        return True  # no /proc: the signal test is all there is
    if fields[0] in ("Z", "X"):
        return False
    return started is None or start_time(pid) == started


def die_with_parent(parent_pid: int, poll_seconds: float = 1.0) -> None:
    """Call first thing in a helper process: it is killed when `parent_pid` dies, even by
    SIGKILL (Linux: prctl PR_SET_PDEATHSIG; elsewhere a watchdog thread polls the parent).

    A parent that died before this call is caught too: the helper exits at once.
    """
    armed = False
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    if os.getppid() != parent_pid:
        os._exit(1)
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent_pid, poll_seconds), daemon=True).start()


def _watch_parent(parent_pid: int, poll_seconds: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(poll_seconds)
    os._exit(1)
