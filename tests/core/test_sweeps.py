"""A multirun job writes to a folder of its own: short, unique, its overrides inside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra.conf import HydraConf
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from sprinter_train.core.sweeps import job_dir


@pytest.fixture
def as_multirun_job():
    """Pretend to be job `num` of a Hydra multirun with `overrides` (what HydraConfig holds
    in a launched job); cleared afterwards."""

    def _job(num: int, overrides: list[str]) -> None:
        hydra = OmegaConf.structured(HydraConf)
        hydra.mode, hydra.job.num, hydra.overrides.task = RunMode.MULTIRUN, num, overrides
        HydraConfig.instance().set_config(OmegaConf.create({"hydra": hydra}))

    yield _job
    HydraConfig.instance().cfg = None


def test_a_single_run_writes_to_the_base_folder(tmp_path: Path) -> None:
    assert job_dir(tmp_path / "bench") == tmp_path / "bench"


def test_every_job_of_a_long_sweep_gets_a_short_folder_of_its_own(
    tmp_path: Path, as_multirun_job
) -> None:
    """~20 overrides named the folder after all of them: past 255 bytes every job failed at
    write time with `File name too long`, after decoding."""
    common = [f"methods.sv.companion_plan.window={256 + i}" for i in range(20)]
    folders = []
    for num, h in enumerate(("0.3", "0.5")):
        overrides = ["stage=bench", *common, f"methods.svip.h={h}"]
        as_multirun_job(num, overrides)
        folder = job_dir(tmp_path / "bench")
        folders.append(folder)
        assert folder.parent == tmp_path / "bench" / "sweep" and len(folder.name) < 16
        saved = json.loads((folder / "overrides.json").read_text())
        assert saved == {"job": num, "overrides": overrides}
    assert folders[0] != folders[1]
    # an export of two settings: two folders, neither job's output lost
    as_multirun_job(0, ["stage=export", "methods.sprinter.tau=0.3"])
    first = job_dir(tmp_path / "export-sprinter")
    as_multirun_job(1, ["stage=export", "methods.sprinter.tau=0.7"])
    assert job_dir(tmp_path / "export-sprinter") != first
