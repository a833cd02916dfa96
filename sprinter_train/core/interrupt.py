"""An interrupted stage fails loudly: exit 128 + signal, naming what it had finished.

Lightning turns SIGTERM into `SIGTERMException`, a SystemExit with code 0, and a KeyboardInterrupt
into exit 1: a stage=train killed by a scheduler reported success with verifiers missing, and
stage=all went on as if nothing happened. Under `interruptible`, SIGTERM and SIGINT raise
`StageInterrupted` wherever the stage is (finally blocks run: background processes are
stopped), and what each stage recorded with `note_completed` is named in the report.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_completed: dict[str, str] = {}  # what the running stage has finished and written, in order
AGAIN_AFTER_S = 0.1  # an interrupt raised where Python drops exceptions comes again this late


class StageInterrupted(BaseException):
    """A stage stopped by a signal. A BaseException, like KeyboardInterrupt, so that no
    `except Exception` in a stage (or in Lightning) can swallow it."""

    def __init__(self, signum: int, stage: str = "the stage", completed: list[str] | None = None):
        super().__init__(signum)
        self.signum = int(signum)
        self.stage = stage
        self.completed = list(completed or [])

    @property
    def exit_code(self) -> int:
        """128 + the signal number: 143 for SIGTERM, 130 for SIGINT, as a shell reports them."""
        return 128 + self.signum

    def report(self) -> str:
        name = signal.Signals(self.signum).name
        done = (
            f"Completed before the interruption: {'; '.join(self.completed)}."
            if self.completed
            else "None of the parts it reports had finished (resumable work already on disk, "
            "such as finished harvest shards, is kept)."
        )
        return (
            f"{self.stage} was interrupted by {name} (exit {self.exit_code}) and did not finish. "
            f"{done} Run the same command again to finish."
        )


def note_completed(key: str, what: str) -> None:
    """Record a finished, written piece of the running stage (a later note of the same key,
    e.g. a resumable state saved again, replaces the earlier one)."""
    _completed.pop(key, None)
    _completed[key] = what


def _raise(signum: int, frame: object) -> None:
    raise StageInterrupted(signum)


def _dropped(previous: Callable[[Any], object]) -> Callable[[Any], None]:
    """An unraisable hook: Python runs a signal handler wherever the main thread is, a weakref
    callback or a `__del__` among them (torch's compile runs many), and drops what those
    raise; so a dropped `StageInterrupted` has its signal sent again, once the stage's own
    code runs. Other unraisables go to `previous`."""

    def hook(unraisable: Any) -> None:
        error = getattr(unraisable, "exc_value", None)
        if isinstance(error, StageInterrupted):
            threading.Timer(AGAIN_AFTER_S, os.kill, (os.getpid(), error.signum)).start()
            return
        previous(unraisable)

    return hook


def _is_lightning_sigterm(error: SystemExit) -> bool:
    module = sys.modules.get("pytorch_lightning.utilities.exceptions")
    return module is not None and isinstance(error, module.SIGTERMException)


@contextmanager
def interruptible(stage: str) -> Iterator[None]:
    """Run a stage with SIGTERM and SIGINT raising StageInterrupted (the previous handlers are
    restored after); a Lightning SIGTERMException or a KeyboardInterrupt becomes one too, and
    one raised where Python drops exceptions comes again (`_dropped`)."""
    _completed.clear()
    signals = (signal.SIGTERM, signal.SIGINT)
    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.getsignal(s) for s in signals} if main else {}
    for s in previous:
        signal.signal(s, _raise)
    unraisable = sys.unraisablehook
    sys.unraisablehook = _dropped(unraisable)
    try:
        yield
    except StageInterrupted as stop:
        raise StageInterrupted(stop.signum, stage, list(_completed.values())) from None
    except KeyboardInterrupt:
        raise StageInterrupted(signal.SIGINT, stage, list(_completed.values())) from None
    except SystemExit as error:
        if not _is_lightning_sigterm(error):
            raise
        raise StageInterrupted(signal.SIGTERM, stage, list(_completed.values())) from None
    finally:
        sys.unraisablehook = unraisable
        for s, handler in previous.items():
            signal.signal(s, handler)
        _completed.clear()
