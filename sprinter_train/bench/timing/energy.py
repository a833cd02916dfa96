"""Energy consumed over an interval, from the hardware's own counters where it exposes them.

Speculative decoding trades extra draft work for fewer target calls, so a faster decoder is
not automatically a cheaper one; joules per token answer that. Counters are not always there
(containers hide RAPL, reading it needs root since CVE-2020-8694, NVML needs pynvml and a Volta
or newer GPU), so the meter reports None with a reason instead of failing the benchmark.

Sources: RAPL package domains for a CPU device, NVML total energy for a CUDA device. Each
covers the whole package or GPU, other processes included, so measure on a quiet machine.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

import torch

from sprinter_train.core.runtime import synchronize

_PACKAGE_ZONE = re.compile(r"intel-rapl:\d+")


class Unavailable(Exception):
    """A counter that cannot be read; the message becomes `EnergyMeter.unavailable_reason`."""


class _RaplPackages:
    """Sum of the top-level RAPL zones (one per CPU package), subzones excluded.

    Subzones (core, uncore, dram) are parts of a package and would be counted twice; a
    top-level "psys" zone covers the whole platform, packages included, so it is left out too.
    """

    def __init__(self, root: Path):
        zones = sorted(p for p in root.glob("intel-rapl:*") if _PACKAGE_ZONE.fullmatch(p.name))
        self.zones = [zone for zone in zones if _read_name(zone) != "psys"]
        if not self.zones:
            raise Unavailable(f"no RAPL package domains under {root}")
        self.ranges = [_read_int(zone / "max_energy_range_uj") for zone in self.zones]

    def read(self) -> list[int]:
        return [_read_int(zone / "energy_uj") for zone in self.zones]

    def close(self) -> None:
        """Nothing to release: sysfs files are opened per read."""

    def joules(self, start: list[int], end: list[int]) -> float:
        """Counters wrap to 0 after max_energy_range_uj: a negative delta means one wrap.

        More than one wrap in an interval cannot be seen, so intervals must stay shorter than
        a wrap period (about 262 kJ per package: over 40 minutes at 100 W).
        """
        total = 0
        for before, after, span in zip(start, end, self.ranges, strict=True):
            delta = after - before
            total += delta + span if delta < 0 else delta
        return total / 1e6


class _NvmlDevice:
    """NVML's millijoule counter since driver load, for the GPU torch calls `device`."""

    def __init__(self, device: torch.device):
        self.nvml = _import_pynvml()
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as error:
            raise Unavailable(f"NVML cannot start: {error}") from error
        try:
            self.handle = _nvml_handle(self.nvml, device)
        except self.nvml.NVMLError as error:
            self.close()
            raise Unavailable(f"NVML has no handle for {device}: {error}") from error

    def read(self) -> int:
        try:
            return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except self.nvml.NVMLError as error:
            raise Unavailable(f"NVML energy counter unavailable: {error}") from error

    def close(self) -> None:
        """nvmlInit is reference-counted: balance it."""
        with contextlib.suppress(self.nvml.NVMLError):  # already shut down elsewhere
            self.nvml.nvmlShutdown()

    @staticmethod
    def joules(start: int, end: int) -> float:
        return (end - start) / 1e3


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as error:
        raise Unavailable(f"pynvml is not installed (pip install nvidia-ml-py): {error}") from error
    return pynvml


def _nvml_handle(nvml: ModuleType, device: torch.device) -> object:
    """By UUID when torch can tell it: NVML numbers all GPUs, torch only the visible ones."""
    if not torch.cuda.is_available():
        return nvml.nvmlDeviceGetHandleByIndex(device.index or 0)
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except nvml.NVMLError:
            pass  # MIG slices name devices differently: fall back to the index
    return nvml.nvmlDeviceGetHandleByIndex(index)


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except OSError as error:
        raise Unavailable(f"cannot read {path}: {error.strerror or error}") from error
    except ValueError as error:
        raise Unavailable(f"unexpected content in {path}: {error}") from error


def _read_name(zone: Path) -> str | None:
    try:
        return (zone / "name").read_text().strip()
    except OSError:
        return None


class EnergyMeter:
    """Joules consumed on `device` between start() and stop(), or None and a reason.

    >>> with EnergyMeter(device) as meter:
    ...     run()
    >>> meter.joules, meter.unavailable_reason
    """

    def __init__(self, device: torch.device, powercap_root: str = "/sys/class/powercap"):
        self.device = device
        self.powercap_root = Path(powercap_root)
        self.unavailable_reason: str | None = None
        self.joules: float | None = None
        self._source: _RaplPackages | _NvmlDevice | None = None
        self._start: Any = None

    def _open(self) -> _RaplPackages | _NvmlDevice:
        if self.device.type == "cpu":
            return _RaplPackages(self.powercap_root)
        if self.device.type == "cuda":
            return _NvmlDevice(self.device)
        raise Unavailable(f"no energy counter for device type {self.device.type!r}")

    def _drain(self) -> None:
        """Queued GPU work must land inside the interval it belongs to (no-op without CUDA)."""
        if self.device.type != "cuda" or torch.cuda.is_available():
            synchronize(self.device)

    def start(self) -> None:
        """Read the counters now; a failure is kept as the reason, not raised."""
        if self._source is not None:
            self._source.close()
        self.joules, self.unavailable_reason, self._source = None, None, None
        try:
            source = self._open()
        except Unavailable as error:
            self.unavailable_reason = str(error)
            return
        try:
            self._drain()
            self._start = source.read()
        except Unavailable as error:
            source.close()
            self.unavailable_reason = str(error)
            return
        self._source = source

    def stop(self) -> float | None:
        """Joules since start(), or None with `unavailable_reason` set."""
        source, self._source = self._source, None
        if source is None:
            if self.unavailable_reason is None:
                self.unavailable_reason = "stop() called before start()"
            return None
        try:
            self._drain()
            end = source.read()
        except Unavailable as error:
            self.unavailable_reason = str(error)
            return None
        finally:
            source.close()
        self.joules = source.joules(self._start, end)
        return self.joules

    def __enter__(self) -> EnergyMeter:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
