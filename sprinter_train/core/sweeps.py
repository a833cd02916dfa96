"""Where each job of a Hydra multirun writes, so that no job overwrites another's.

A sweep folder named by the job's whole override list fails at write time once the list is
long (`OSError: File name too long` after every job decoded), and jobs whose outputs are
named by the method alone share one folder. A job's folder is instead its number and a short
hash of its overrides, with the overrides written inside (`overrides.json`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from sprinter_train.core.io import write_json


def sweep_job() -> dict[str, Any] | None:
    """This process's multirun job (`num`, `overrides`, `folder`), None outside a multirun."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra_cfg = HydraConfig.get()
    except (ImportError, ValueError):  # not launched by Hydra (tests, stage=all from code)
        return None
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    overrides = list(hydra_cfg.overrides.task)
    digest = hashlib.sha256("\n".join(sorted(overrides)).encode()).hexdigest()[:8]
    num = int(hydra_cfg.job.num)
    return {"num": num, "overrides": overrides, "folder": f"{num:03d}-{digest}"}


def job_dir(base: Path) -> Path:
    """`base` for a single run; `base`/sweep/<job>-<hash> for a multirun job, its overrides
    written inside."""
    job = sweep_job()
    if job is None:
        return base
    out = base / "sweep" / job["folder"]
    write_json(out / "overrides.json", {"job": job["num"], "overrides": job["overrides"]})
    return out
