"""The cores this process may use, how busy other work keeps them, and the torch threads that
fit in what is left.

Why: two torch threads on two cores that another job also wants spin against each other
(OpenMP's teams wait for their slowest member), and a 2-thread stage beside two CPU-bound
jobs runs several times slower than a 1-thread one (docs/results/design-figures.md, "Threads
beside busy cores"). So a stage asks for as many threads as there are free cores, measured
when it starts, unless `num_threads` says otherwise.

"Busy" is measured, not guessed from the 1-minute load average (which lags by a minute and,
in `stage=all`, still counts the previous stage's own threads): the CPU time the cores this
process may run on spent over a short window in /proc/stat, less this process's own CPU time.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

# torch's own choice before anything changed it (physical cores on most machines)
TORCH_DEFAULT_THREADS = torch.get_num_threads()
_warned: list[str] = []


@dataclass(frozen=True)
class MachineState:
    """What a stage starting now may use: `cores` it may run on, `busy` of those kept busy by
    other processes (None: could not be measured), the 1-minute `load` average (None: none)."""

    cores: int
    busy: float | None
    load: float | None

    @property
    def free(self) -> float:
        """Cores nobody else is using: the measured ones, else the load average's guess."""
        other = self.busy if self.busy is not None else self.load
        return self.cores - (other or 0.0)


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str  # "num_threads", or the figures the choice was made from


def usable_cores(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """CPUs in this process's affinity mask, capped by a cgroup CPU quota where one is set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        with open(cpu_max) as handle:
            quota, period = handle.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def cpu_jiffies(text: str, cpus: set[int] | None) -> int | None:
    """Busy clock ticks (all but idle and iowait) of `cpus` (the aggregate line when None) in
    /proc/stat's `text`; None when none of the CPUs is listed."""
    busy = 0
    found = False
    for line in text.splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu"):
            continue
        if (cpus is None) != (name == "cpu"):
            continue
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
        busy += sum(ticks) - ticks[3] - ticks[4]
        found = True
    return busy if found else None


def own_cpu_seconds() -> float:
    """CPU time this process (all its threads, not its children) has used."""
    times = os.times()
    return times.user + times.system


def busy_cores(
    window_s: float = 0.3,
    stat: str = "/proc/stat",
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    own_cpu: Callable[[], float] = own_cpu_seconds,
) -> float | None:
    """Cores kept busy by other processes over `window_s` (this process's own CPU time taken
    out); None where /proc/stat cannot be read."""
    try:
        cpus: set[int] | None = set(os.sched_getaffinity(0))
    except AttributeError:
        cpus = None

    def sample() -> tuple[int | None, float, float]:
        with open(stat) as handle:
            text = handle.read()
        ticks = cpu_jiffies(text, cpus)
        return ticks if ticks is not None else cpu_jiffies(text, None), own_cpu(), clock()

    try:
        before, own_before, t0 = sample()
        sleep(window_s)
        after, own_after, t1 = sample()
    except (OSError, ValueError):
        return None
    if before is None or after is None or t1 <= t0:
        return None
    per_second = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = (after - before) / per_second / (t1 - t0)
    own = (own_after - own_before) / (t1 - t0)
    return max(0.0, busy - own)


def read_machine(window_s: float = 0.3) -> MachineState:
    """The machine as a stage starting now finds it (tests replace this with a fixed one)."""
    return MachineState(usable_cores(), busy_cores(window_s), load_average())


def quiet_machine(cores: int = 1) -> MachineState:
    """An idle machine of `cores`: what tests run under, so no test reads the real load."""
    return MachineState(cores, 0.0, 0.0)


def choose_threads(requested: int | None, state: MachineState | None, default: int) -> ThreadChoice:
    """`requested` when set (> 0); else the free cores of `state`, rounded, at least 1 and at
    most `default` (torch's own choice) and the usable cores."""
    if requested:
        return ThreadChoice(int(requested), "num_threads")
    if state is None:
        raise ValueError("without num_threads the choice needs the machine's state")
    free = max(1, math.floor(state.free + 0.5))
    threads = min(default, state.cores, free)
    busy = "unmeasured" if state.busy is None else f"{state.busy:.1f}"
    reason = (
        f"{busy} of {state.cores} usable cores busy with other work (load average "
        f"{state.load if state.load is None else round(state.load, 2)})"
    )
    return ThreadChoice(threads, reason)


def fit_threads(requested: int | None) -> int:
    """Set torch's intra-op threads for this stage (and OMP_NUM_THREADS for its children):
    `requested`, or what the free cores allow; warns once per process when other work takes
    cores away, with the figures and the override. The machine is read (a short sampling
    window of /proc/stat) only when there is no `requested`."""
    state = None if requested else read_machine()
    choice = choose_threads(requested, state, TORCH_DEFAULT_THREADS)
    torch.set_num_threads(choice.threads)
    os.environ["OMP_NUM_THREADS"] = str(choice.threads)
    if choice.reason != "num_threads" and choice.threads < TORCH_DEFAULT_THREADS:
        message = (
            f"{choice.reason}: running with {choice.threads} torch thread(s) instead of "
            f"{TORCH_DEFAULT_THREADS}; set num_threads={TORCH_DEFAULT_THREADS} to override"
        )
        if not _warned:
            log.warning(message)
            _warned.append(message)
        else:
            log.info(message)
    return choice.threads
