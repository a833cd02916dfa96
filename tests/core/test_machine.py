"""core/machine.py: busy cores measured from /proc/stat less this process's own time, the
cgroup quota, and the thread choice every stage makes from them.

The readings are imported by name at collection, before conftest's `_machine_readings`
replaces the module's attributes: these tests run the real functions on files they write."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from sprinter_train.core import machine
from sprinter_train.core.machine import (
    MachineState,
    busy_cores,
    choose_threads,
    cpu_jiffies,
    usable_cores,
)

CPUS = sorted(os.sched_getaffinity(0))


def stat_text(busy: int, idle: int, other_cpu_busy: int = 0) -> str:
    """/proc/stat with `busy` user ticks and `idle` idle ticks on each of this process's CPUs
    and one CPU outside its affinity mask, busy for `other_cpu_busy`."""
    lines = [f"cpu  {busy * len(CPUS)} 0 0 {idle * len(CPUS)} 0 0 0 0 0 0"]
    lines += [f"cpu{c} {busy} 0 0 {idle} 0 0 0 0 0 0" for c in CPUS]
    lines.append(f"cpu{max(CPUS) + 1} {other_cpu_busy} 0 0 0 0 0 0 0 0 0")
    lines.append("intr 1 2 3")
    return "\n".join(lines) + "\n"


def test_cpu_jiffies_counts_the_given_cpus_busy_ticks() -> None:
    text = "cpu  10 1 2 30 4 0 0 3 0 0\ncpu0 5 0 1 15 2 0 0 1 0 0\ncpu1 5 1 1 15 2 0 0 2 0 0\n"
    assert cpu_jiffies(text, {0}) == 7  # user + system + steal; idle and iowait not
    assert cpu_jiffies(text, {0, 1}) == 16
    assert cpu_jiffies(text, None) == 16  # the aggregate line
    assert cpu_jiffies(text, {7}) is None


@pytest.mark.parametrize(("other_work", "own"), [(0.0, 0.0), (1.5, 0.0), (2.0, 0.5)])
def test_busy_cores_is_the_cores_time_less_this_process(tmp_path, other_work, own) -> None:
    """Over a 2 s window each of the process's CPUs gains ticks; the result is their busy
    cores less the CPU time this process spent in the window."""
    tick = os.sysconf("SC_CLK_TCK")
    stat = tmp_path / "stat"
    stat.write_text(stat_text(busy=0, idle=0))
    per_cpu = (other_work + own) / len(CPUS) * 2.0 * tick  # ticks over 2 s
    clock = iter([100.0, 102.0])
    cpu = iter([10.0, 10.0 + own * 2.0])

    def sleep(_: float) -> None:
        stat.write_text(stat_text(busy=round(per_cpu), idle=1000, other_cpu_busy=10**6))

    got = busy_cores(
        1.0, str(stat), sleep=sleep, clock=lambda: next(clock), own_cpu=lambda: next(cpu)
    )
    assert got == pytest.approx(other_work, abs=len(CPUS) / (2.0 * tick) + 1e-9)


def test_busy_cores_is_none_without_proc_stat(tmp_path) -> None:
    assert busy_cores(0.0, str(tmp_path / "missing"), sleep=lambda _: None) is None


def test_usable_cores_honours_a_cgroup_quota(tmp_path) -> None:
    quota = tmp_path / "cpu.max"
    quota.write_text("max 100000\n")
    assert usable_cores(str(quota)) == len(CPUS)
    quota.write_text("50000 100000\n")  # half a core: one thread
    assert usable_cores(str(quota)) == 1
    assert usable_cores(str(tmp_path / "none")) == len(CPUS)


@pytest.mark.parametrize(
    ("state", "default", "threads"),
    [
        (MachineState(2, 0.1, 0.4), 2, 2),  # quiet
        (MachineState(2, 1.0, 1.0), 2, 1),  # one other job
        (MachineState(2, 2.0, 4.0), 2, 1),  # two other jobs: never below one
        (MachineState(8, 2.2, 3.0), 4, 4),  # torch's own choice caps it
        (MachineState(8, 5.6, 3.0), 8, 2),
        (MachineState(2, None, 2.0), 2, 1),  # unmeasured: the load average decides
        (MachineState(2, None, None), 2, 2),
    ],
)
def test_threads_fit_the_free_cores(state, default, threads) -> None:
    assert choose_threads(None, state, default).threads == threads
    assert choose_threads(0, state, default).threads == threads
    assert choose_threads(3, state, default) == machine.ThreadChoice(3, "num_threads")


def test_a_stage_warns_once_with_the_figures(monkeypatch, caplog) -> None:
    monkeypatch.setattr(machine, "TORCH_DEFAULT_THREADS", 2)
    monkeypatch.setattr(machine, "_warned", [])
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    reads: list[float] = []
    busy = MachineState(2, 1.8, 2.5)
    monkeypatch.setattr(machine, "read_machine", lambda window_s=0.3: reads.append(1) or busy)
    with caplog.at_level(logging.INFO, logger=machine.__name__):
        assert machine.fit_threads(0) == 1 and torch.get_num_threads() == 1
        assert machine.fit_threads(None) == 1
        assert machine.fit_threads(2) == 2 and torch.get_num_threads() == 2
    assert len(reads) == 2  # num_threads given: the machine is not read (no 0.3 s window)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "1.8 of 2 usable cores busy" in warnings[0].message
    assert "load average 2.5" in warnings[0].message and "num_threads=2" in warnings[0].message
    assert os.environ["OMP_NUM_THREADS"] == "2"
