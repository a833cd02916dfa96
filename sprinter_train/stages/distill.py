"""stage=distill: build or continue a small draft (or companion) and export it.

python -m sprinter_train stage=distill distill.max_minutes=60             # the draft
python -m sprinter_train stage=distill distill=companion                  # the SV companion

One run at a time per work dir: `distill.lock` there names the run and its background teacher
(the teacher dies with the run, even a SIGKILLed one), and a run whose processes are gone
leaves a stale lock and temporary files that the next run sweeps. What the run starts from is
distill/start.py's, the folder it writes distill/output.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from sprinter_train.core import pidlock
from sprinter_train.core.io import sweep_stale_temps
from sprinter_train.core.plots import plot_curve
from sprinter_train.core.runtime import resolve_device, set_threads
from sprinter_train.distill.corpus import CORPUS_SOURCE
from sprinter_train.distill.output import output_dir, warm_start, write_output
from sprinter_train.distill.start import (
    heldout_tokens,
    start_teacher_producer,
    starting_student,
    training_text,
)
from sprinter_train.distill.trainer import load_checkpoint, train
from sprinter_train.models.roles import load_role
from sprinter_train.stages.model_settings import check_model_settings

LOCK_NAME = "distill.lock"
WORK_FOLDERS = ("", "corpus", "heldout", "teacher")  # atomic_write's temp files swept at start


def _path(value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else Path.cwd() / path


def run(cfg: DictConfig) -> dict[str, Any]:
    dcfg: dict[str, Any] = OmegaConf.to_container(cfg.distill, resolve=True)
    if cfg.data.source != CORPUS_SOURCE:
        raise ValueError(
            f"stage=distill builds its corpus from {CORPUS_SOURCE} conversations (data=sharegpt);"
            f" data={cfg.data.name} reads {cfg.data.source}"
        )
    check_model_settings(cfg, "distill")  # before the teacher loads or the work dir is swept
    work = _path(dcfg["work_dir"])
    with pidlock.held(work / LOCK_NAME, f"the distillation work dir {work}") as lock:
        for folder in (*WORK_FOLDERS, dcfg["role"]):
            sweep_stale_temps(work / folder)
        return distill(cfg, dcfg, work, lock)


def distill(cfg: DictConfig, dcfg: dict[str, Any], work: Path, lock: Path) -> dict[str, Any]:
    """Corpus, student, training (teacher in the background on CPU), export; under the lock."""
    set_threads(cfg.get("num_threads"))
    device = resolve_device(cfg.device)
    teacher = load_role(cfg.models, "target", device, torch.float32, pack_linear=False)
    corpus = training_text(cfg, dcfg, teacher, work)
    heldout = heldout_tokens(cfg, dcfg, teacher, work, device)

    role_dir = work / dcfg["role"]
    checkpoint = role_dir / "state.pt"
    out = output_dir(dcfg)
    resume = load_checkpoint(checkpoint) or warm_start(out, dcfg)
    student = starting_student(resume, teacher, corpus, heldout, dcfg, device)
    producer = start_teacher_producer(cfg, dcfg, corpus, work / "teacher", resume, device)
    try:
        if producer is not None:  # the lock stays held while the teacher runs
            pidlock.add_process(lock, producer.pid)
        state = train(
            student,
            teacher.model,
            corpus,
            work / "teacher",
            checkpoint,
            dcfg,
            heldout,
            device,
            resume,
            producer,
        )
    finally:
        if producer is not None:
            producer.terminate()
            producer.join()
    if dcfg.get("export", True):
        write_output(student, teacher, out, dcfg, state.__dict__, cfg)
    plot_curve(state.curve, role_dir / "curve.png", title=f"distillation of the {dcfg['role']}")
    last_alpha = next(
        (p["heldout_alpha_t1"] for p in reversed(state.curve) if "heldout_alpha_t1" in p), None
    )
    return {
        "tokens": state.tokens,
        "minutes": state.seconds / 60,
        "heldout_alpha_t1": last_alpha,
        "output_dir": str(out),
    }
