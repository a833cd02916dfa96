"""What a measurement ran under, so a number can be traced and a run under load recognised.

bench/results.json and draft_eval.json both carry it: the resolved config, the code version,
device, dtype, torch threads, the machine's load average at the start and end, and hashes of
the models, verifier and table they used (as eval/report.json does for its inputs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from sprinter_train.core import machine
from sprinter_train.core.compile_cache import compile_counters, compile_record
from sprinter_train.core.io import file_sha256
from sprinter_train.harvest.manifest import code_version, model_identity
from sprinter_train.models.loading import LoadedModel


def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    return machine.load_average()


def cores() -> int:
    """The cores this process may run on (affinity, cgroup quota)."""
    return machine.usable_cores()


def under_load(load: float | None, own_threads: int = 0) -> bool:
    """Other work was runnable beside the measurement: the load, less the measuring process's
    own threads (a 2-thread bench alone reads about 2.0), exceeds the cores it left free, and
    by at least half a process (the 1-minute average lags and wobbles)."""
    if load is None:
        return False
    return load - own_threads > max(0.5, cores() - own_threads)


def busy_cores() -> float | None:
    """Cores other processes keep busy now, measured over a short window with this process's
    own time left out (None where it cannot be measured)."""
    return machine.busy_cores()


def shared(busy: float | None, load: float | None, own_threads: int = 0) -> bool:
    """Other work ran beside a measurement: more than half a core measured busy by other
    processes, or where that is unmeasured the load average's guess (`under_load`). At the
    start of a stage that follows another in one process (stage=all) the load average still
    counts the previous stage's own threads; the measured figure does not."""
    if busy is not None:
        return busy > 0.5
    return under_load(load, own_threads)


def ran_under_load(
    busy_start: float | None,
    load_start: float | None,
    busy_end: float | None,
    load_end: float | None,
    own_threads: int,
) -> bool:
    """Whether a timed run (the bench, a latency profile) shared the machine: other work at its
    start or end, or in the end's 1-minute load average beyond the run's own threads (which
    covers the run's last minute)."""
    return (
        shared(busy_start, load_start)
        or shared(busy_end, None)
        or under_load(load_end, own_threads)
    )


def start(cfg: DictConfig, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    """The provenance known before the run; `finish` adds the end load."""
    return {
        "config": OmegaConf.to_container(cfg, resolve=True),
        "code_version": code_version(),
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "torch_threads": torch.get_num_threads(),
        "cores": cores(),
        "load_average_start": load_average(),
        "busy_cores_start": busy_cores(),
        "compile_counters_start": compile_counters(),
    }


def finish(
    provenance: dict[str, Any], compile_seconds: float = 0.0, **hashes: Any
) -> dict[str, Any]:
    """Provenance with the end load, whether the run was under load, the input hashes and
    what the run compiled (`compile_seconds`: its forwards' compile time; the on-disk
    cache's hits and misses since `start`)."""
    before = provenance.pop("compile_counters_start", None) or {"hits": 0, "misses": 0}
    end, busy = load_average(), busy_cores()
    loaded = ran_under_load(
        provenance.get("busy_cores_start"),
        provenance["load_average_start"],
        busy,
        end,
        int(provenance.get("torch_threads") or 0),
    )
    return {
        **provenance,
        "load_average_end": end,
        "busy_cores_end": busy,
        "under_load": loaded,
        "compile": compile_record(before, compile_seconds),
        "hashes": hashes,
    }


def model_hashes(models: dict[str, LoadedModel | None]) -> dict[str, Any]:
    """Each model's identity (id, revision, file signature) as the harvest manifest has it."""
    return {role: model_identity(m) for role, m in models.items() if m is not None}


def file_hash(path: str | Path | None) -> str | None:
    """sha256 (16 hex) of an input file the run used, None when it used none."""
    if path is None or not Path(path).exists():
        return None
    return file_sha256(Path(path))[:16]


def load_warning(provenance: dict[str, Any]) -> str | None:
    """The results.md warning for a run under load, else None."""
    if not provenance.get("under_load"):
        return None
    busy = [provenance.get(f"busy_cores_{at}") for at in ("start", "end")]
    measured = (
        ""
        if busy == [None, None]
        else f"; other processes kept {fmt(busy[0])} and {fmt(busy[1])} cores busy at the "
        "start and the end"
    )
    return (
        f"**Warning:** the load average ({provenance['load_average_start']} at the start, "
        f"{provenance['load_average_end']} at the end, this run's own "
        f"{provenance.get('torch_threads')} threads included{measured}) says other work shared "
        f"the {provenance['cores']} cores during this run: the timings are slower than alone."
    )


def fmt(cores: float | None) -> str:
    return "?" if cores is None else f"{cores:.1f}"
