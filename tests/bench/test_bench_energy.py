"""EnergyMeter against fake powercap trees and a fake pynvml: joules, wrap-around, reasons."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from sprinter_train.bench.timing.energy import EnergyMeter

CPU = torch.device("cpu")
RANGE_UJ = 262_143_328_850


def _zone(root: Path, name: str, label: str, energy_uj: int, max_uj: int = RANGE_UJ) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "name").write_text(f"{label}\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return zone


def _set(zone: Path, energy_uj: int) -> None:
    (zone / "energy_uj").write_text(f"{energy_uj}\n")


@pytest.fixture
def two_packages(tmp_path: Path) -> tuple[Path, Path, Path]:
    package0 = _zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000)
    package1 = _zone(tmp_path, "intel-rapl:1", "package-1", 5_000_000)
    # parts of package 0 and the whole platform: counting them would double the energy
    _zone(package0, "intel-rapl:0:0", "core", 0)
    _zone(tmp_path, "intel-rapl:0:1", "dram", 0)
    _zone(tmp_path, "intel-rapl:2", "psys", 0)
    _zone(tmp_path, "intel-rapl-mmio:0", "package-0", 0)
    return tmp_path, package0, package1


def test_sums_package_domains_only(two_packages) -> None:
    root, package0, package1 = two_packages
    meter = EnergyMeter(CPU, powercap_root=str(root))
    meter.start()
    _set(package0, 3_500_000)
    _set(package1, 6_000_000)
    for subzone in ("intel-rapl:0:1", "intel-rapl:2", "intel-rapl-mmio:0"):
        _set(root / subzone, 99_000_000)
    _set(package0 / "intel-rapl:0:0", 99_000_000)
    assert meter.stop() == pytest.approx(3.5)
    assert meter.joules == pytest.approx(3.5)
    assert meter.unavailable_reason is None


def test_counter_wrap_around(tmp_path: Path) -> None:
    package = _zone(tmp_path, "intel-rapl:0", "package-0", 990, max_uj=1000)
    with EnergyMeter(CPU, powercap_root=str(tmp_path)) as meter:
        _set(package, 15)  # 10 uJ up to the range, then 15 after the wrap
    assert meter.joules == pytest.approx(25e-6)


def test_no_rapl_is_a_reason(tmp_path: Path) -> None:
    with EnergyMeter(CPU, powercap_root=str(tmp_path / "absent")) as meter:
        pass
    assert meter.joules is None
    assert "no RAPL package domains" in meter.unavailable_reason


def test_missing_counter_file_is_a_reason(two_packages) -> None:
    root, _, package1 = two_packages
    (package1 / "energy_uj").unlink()
    meter = EnergyMeter(CPU, powercap_root=str(root))
    meter.start()
    assert meter.stop() is None
    assert str(package1 / "energy_uj") in meter.unavailable_reason


def test_permission_denied_is_a_reason(two_packages, monkeypatch: pytest.MonkeyPatch) -> None:
    # since CVE-2020-8694 energy_uj is root-only; tests may run as root, so fake the refusal
    root, package0, _ = two_packages
    denied = package0 / "energy_uj"
    read_text = Path.read_text

    def refuse(self: Path, *args, **kwargs) -> str:
        if self == denied:
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", refuse)
    with EnergyMeter(CPU, powercap_root=str(root)) as meter:
        pass
    assert meter.joules is None
    assert meter.unavailable_reason == f"cannot read {denied}: Permission denied"


def test_counter_lost_between_start_and_stop(two_packages) -> None:
    root, package0, _ = two_packages
    meter = EnergyMeter(CPU, powercap_root=str(root))
    meter.start()
    (package0 / "energy_uj").unlink()
    assert meter.stop() is None
    assert "energy_uj" in meter.unavailable_reason


def test_stop_without_start_and_restart(two_packages) -> None:
    root, package0, _ = two_packages
    meter = EnergyMeter(CPU, powercap_root=str(root))
    assert meter.stop() is None
    assert "before start" in meter.unavailable_reason
    meter.start()
    _set(package0, 2_000_000)
    assert meter.stop() == pytest.approx(1.0)
    assert meter.unavailable_reason is None


def test_cuda_without_pynvml_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with EnergyMeter(torch.device("cuda:0")) as meter:
        pass
    assert meter.joules is None
    assert "pynvml is not installed" in meter.unavailable_reason


def test_other_device_types_are_a_reason() -> None:
    with EnergyMeter(torch.device("meta")) as meter:
        pass
    assert meter.joules is None
    assert "'meta'" in meter.unavailable_reason


class _FakeNvmlError(Exception):
    pass


def _fake_pynvml(readings_mj: list[int], supported: bool = True) -> types.ModuleType:
    """Just the calls the meter makes; records which device index it asked for."""
    fake = types.ModuleType("pynvml")
    fake.NVMLError = _FakeNvmlError
    fake.asked = []
    fake.open = 0

    def init() -> None:
        fake.open += 1

    def shutdown() -> None:
        fake.open -= 1

    def by_index(index: int) -> str:
        fake.asked.append(index)
        return f"gpu{index}"

    def energy(handle: str) -> int:
        if not supported:
            raise _FakeNvmlError("Not Supported")
        assert handle == f"gpu{fake.asked[-1]}"
        return readings_mj.pop(0)

    fake.nvmlInit, fake.nvmlShutdown = init, shutdown
    fake.nvmlDeviceGetHandleByIndex = by_index
    fake.nvmlDeviceGetTotalEnergyConsumption = energy
    return fake


@pytest.mark.skipif(torch.cuda.is_available(), reason="fake NVML stands in for a missing GPU")
def test_nvml_millijoules_for_the_device_index(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_pynvml([10_000, 12_500])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with EnergyMeter(torch.device("cuda:1")) as meter:
        pass
    assert meter.joules == pytest.approx(2.5)
    assert fake.asked == [1]
    assert fake.open == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="fake NVML stands in for a missing GPU")
def test_nvml_unsupported_counter_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_pynvml([], supported=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with EnergyMeter(torch.device("cuda:0")) as meter:
        pass
    assert meter.joules is None
    assert "Not Supported" in meter.unavailable_reason
    assert fake.open == 0
