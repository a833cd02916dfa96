"""stage=distill: build or continue a small draft (or companion) and export it.

python -m sprinter_train stage=distill distill.max_minutes=60             # the draft
python -m sprinter_train stage=distill distill=companion                  # the SV companion

One run at a time per work dir: `distill.lock` there names the run and its background teacher
(the teacher dies with the run, even a SIGKILLed one), and a run whose processes are gone
leaves a stale lock and temporary files that the next run sweeps.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from sprinter_train.core import pidlock
from sprinter_train.core.io import atomic_write, load_npz, read_json, sweep_stale_temps, write_json
from sprinter_train.core.plots import plot_curve
from sprinter_train.core.runtime import resolve_device, set_threads
from sprinter_train.distill.corpus import CORPUS_SOURCE, build_corpus, token_frequencies
from sprinter_train.distill.onpolicy import build_generated_corpus, mix_shards
from sprinter_train.distill.teacher_cache import produce_teacher_shards
from sprinter_train.distill.trainer import heldout_alpha, load_checkpoint, train
from sprinter_train.models import student as student_module
from sprinter_train.models.loading import REPO_ROOT, load_model, model_title
from sprinter_train.models.student import SprinterDraftConfig, SprinterDraftForCausalLM
from sprinter_train.models.student_init import build_student

log = logging.getLogger(__name__)


def _path(value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else Path.cwd() / path


LOCK_NAME = "distill.lock"
WORK_FOLDERS = ("", "corpus", "heldout", "teacher")  # atomic_write's temp files swept at start


def run(cfg: DictConfig) -> dict[str, Any]:
    dcfg: dict[str, Any] = OmegaConf.to_container(cfg.distill, resolve=True)
    if cfg.data.source != CORPUS_SOURCE:
        raise ValueError(
            f"stage=distill builds its corpus from {CORPUS_SOURCE} conversations (data=sharegpt);"
            f" data={cfg.data.name} reads {cfg.data.source}"
        )
    work = _path(dcfg["work_dir"])
    with pidlock.held(work / LOCK_NAME, f"the distillation work dir {work}") as lock:
        for folder in (*WORK_FOLDERS, dcfg["role"]):
            sweep_stale_temps(work / folder)
        return distill(cfg, dcfg, work, lock)


def distill(cfg: DictConfig, dcfg: dict[str, Any], work: Path, lock: Path) -> dict[str, Any]:
    """Corpus, student, training (teacher in the background on CPU), export; under the lock."""
    set_threads(cfg.get("num_threads"))
    device = resolve_device(cfg.device)
    teacher = load_model(
        OmegaConf.to_container(cfg.models.target),
        "target",
        device,
        torch.float32,
        cfg.models.get("cache_dir"),
    )
    ccfg = dcfg["corpus"]
    corpus = build_corpus(
        teacher.tokenizer,
        work / "corpus",
        ccfg["seq_len"],
        ccfg["shard_sequences"],
        ccfg["max_tokens"],
        split_cfg=cfg.data,
        max_user_chars=ccfg["max_user_chars"],
    )
    corpus = training_text(cfg, dcfg, teacher, corpus, work)
    heldout_paths = build_corpus(
        teacher.tokenizer,
        work / "heldout",
        ccfg["seq_len"],
        dcfg["eval_sequences"],
        ccfg["seq_len"] * dcfg["eval_sequences"],
        split_cfg=cfg.data,
        split="test",
        max_user_chars=ccfg["max_user_chars"],
    )
    heldout = torch.from_numpy(load_npz(heldout_paths[0])["tokens"].astype(np.int64)).to(device)

    role_dir = work / dcfg["role"]
    checkpoint = role_dir / "state.pt"
    out = _output_dir(dcfg)
    resume = load_checkpoint(checkpoint) or warm_start(out, dcfg)
    if resume is not None:
        student = SprinterDraftForCausalLM(SprinterDraftConfig(**resume["student_config"]))
        student.load_state_dict(resume["student"])
    else:
        head_ids = None
        if dcfg["student"].get("head_vocab"):
            counts = token_frequencies(corpus, teacher.model.config.vocab_size)
            order = np.argsort(-counts, kind="stable")[: int(dcfg["student"]["head_vocab"])]
            head_ids = torch.from_numpy(np.sort(order)).long()
        student = build_student(teacher.model, head_ids, dcfg["student"], seed=dcfg["seed"])
        student.to(device)  # before the first held-out pass: the teacher and tokens are there
        log.info(
            "new student: %.1fM parameters, held-out alpha before training %.3f",
            sum(p.numel() for p in student.parameters()) / 1e6,
            heldout_alpha(student, teacher.model, heldout),
        )
    student.to(device)
    if dcfg["student"].get("freeze_embedding"):
        student.model.embed_tokens.requires_grad_(False)
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
        export(student, teacher, out, dcfg, state.__dict__, cfg)
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


CORPUS_KINDS = ("replies", "generated", "mix")


def training_text(cfg: DictConfig, dcfg: dict, teacher, replies: list[Path], work: Path):
    """The shards training walks: ShareGPT's replies, the target's own sampled replies at the
    experiment's sampling (on-policy), or both in equal parts (`distill.corpus.source`)."""
    ccfg = dcfg["corpus"]
    source = ccfg.get("source", "replies")
    if source not in CORPUS_KINDS:
        raise ValueError(f"distill.corpus.source={source!r}: expected one of {CORPUS_KINDS}")
    if source == "replies":
        return replies
    gcfg = ccfg["generated"]
    generated = build_generated_corpus(
        teacher.model,
        teacher.tokenizer,
        work / "generated",
        ccfg["seq_len"],
        ccfg["shard_sequences"],
        int(gcfg["max_tokens"]),
        OmegaConf.to_container(cfg.sampling, resolve=True),
        split_cfg=cfg.data,
        max_user_chars=ccfg["max_user_chars"],
        max_new_tokens=int(gcfg["max_new_tokens"]),
        block_prompts=int(gcfg["block_prompts"]),
        seed=int(dcfg["seed"]),
    )
    return generated if source == "generated" else mix_shards(replies, generated)


def _output_dir(dcfg: dict) -> Path:
    path = Path(dcfg["output_dir"]).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


def warm_start(out: Path, dcfg: dict) -> dict[str, Any] | None:
    """Continue from the exported model when the full state is gone (a fresh machine).

    The optimiser state (~200 MB) stays out of git; the exported fp16 weights and their
    training_state.json (tokens, shard cursor, curve) are enough to carry training on.
    """
    state_file = out / "training_state.json"
    if not dcfg.get("warm_start", True) or not state_file.exists():
        return None
    saved = read_json(state_file)
    if saved["recipe"]["student"] != dcfg["student"]:
        log.warning("%s was trained with another student recipe; starting a new student", out)
        return None
    model = SprinterDraftForCausalLM.from_pretrained(out, dtype=torch.float32)
    log.info("warm start from %s at %d tokens (fresh optimiser)", out, saved["state"]["tokens"])
    return {
        "student_config": model.config.to_dict(),
        "student": model.state_dict(),
        "optimizer": None,
        "state": saved["state"],
    }


def start_teacher_producer(cfg, dcfg, corpus, teacher_dir, resume, device):
    """On CPU, run the teacher in its own single-threaded process ahead of the student; it
    dies with this process (even a SIGKILLed one), so it never fills the cache unattended."""
    tcfg = dcfg["teacher"]
    if not tcfg.get("background") or device.type != "cpu":
        return None
    torch.set_num_threads(int(dcfg.get("train_threads") or torch.get_num_threads()))
    first = resume["state"].get("shard", 0) % len(corpus) if resume else 0
    ordered = corpus[first:] + corpus[:first]
    context = mp.get_context("spawn")
    producer = context.Process(
        target=produce_teacher_shards,
        args=(
            OmegaConf.to_container(cfg.models.target, resolve=True),
            cfg.models.get("cache_dir"),
            ordered,
            teacher_dir,
            int(tcfg["top_k"]),
            int(tcfg["batch_size"]),
            int(tcfg.get("threads", 1)),
            os.getpid(),
        ),
        daemon=True,
    )
    producer.start()
    return producer


def export(student, teacher, out: Path, dcfg: dict, state: dict, cfg: DictConfig) -> None:
    """Write a `from_pretrained` directory (fp16 safetensors, tokenizer, modeling code, card)."""
    tmp = out.with_name(f".{out.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    half = SprinterDraftForCausalLM(student.config)
    half.load_state_dict(student.state_dict())
    half.config.auto_map = {
        "AutoConfig": "student.SprinterDraftConfig",
        "AutoModelForCausalLM": "student.SprinterDraftForCausalLM",
    }
    half.to(torch.float16).save_pretrained(tmp, safe_serialization=True)
    teacher.tokenizer.save_pretrained(tmp)
    shutil.copy(student_module.__file__, tmp / "student.py")
    write_json(tmp / "training_state.json", {"recipe": dcfg, "state": state})
    plot_curve(
        state["curve"], tmp / "training_curve.png", title=f"distillation of the {dcfg['role']}"
    )
    atomic_write(tmp / "README.md", lambda p: p.write_text(model_card(dcfg, state, cfg)))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    log.info("exported %s to %s", dcfg["role"], out)


def model_card(dcfg: dict, state: dict, cfg: DictConfig) -> str:
    curve = state["curve"]
    evals = [p for p in curve if "heldout_alpha_t1" in p]
    rows = "\n".join(
        f"| {p['tokens']:,} | {p['minutes']:.1f} | {p['loss']:.3f} | {p['heldout_alpha_t1']:.3f} |"
        for p in evals
    )
    student = dcfg["student"]
    teacher = model_title(OmegaConf.to_container(cfg.models.target, resolve=True))
    data = cfg.data.name
    return f"""# {teacher} {dcfg["role"]} for speculative decoding (sprinter_train)

A small student of **{cfg.models.target.path}** ({cfg.models.target.get("gguf_file") or ""})
with the same tokenizer, distilled for speculative decoding on CPU.
Load it with `AutoModelForCausalLM.from_pretrained(dir)` after `import sprinter_train`,
or with `trust_remote_code=True` without the package.

## Recipe
- init: `{student["init"]}`, target layers {student.get("init_layers")}, embedding rank
  {student.get("embed_rank")}, head restricted to the {student.get("head_vocab")} most frequent
  {data} tokens (q = 0 outside them)
- loss: {dcfg["loss"]["ce_weight"]} x forward KL on the teacher's top-{dcfg["teacher"]["top_k"]}
  + {dcfg["loss"]["tv_weight"]} x (1 - sum min(p, q)) over the same top-k
  + {dcfg["loss"].get("top1_weight", 0.0)} x cross-entropy on the teacher's argmax
- data: {data} (train split by conversation id, seed {cfg.data.seed}), sequences of
  {dcfg["corpus"]["seq_len"]} chat-formatted tokens; text: `{dcfg["corpus"].get("source", "replies")}`
  (replies: the data's own; generated: the target's at the experiment's sampling; mix: both)
- optimiser: AdamW lr {dcfg["optim"]["lr"]}, {dcfg["optim"]["batch_sequences"]} sequences per step
- command: `python -m sprinter_train stage=distill distill={dcfg["name"]}` (resumes from
  `{dcfg["work_dir"]}/{dcfg["role"]}/state.pt`)

## Training so far
- tokens seen: {state["tokens"]:,}; training time: {state["seconds"] / 60:.1f} min on
  {", then ".join(state.get("devices") or ["an unrecorded machine"])} (teacher forwards
  included); written
  {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}

| tokens | minutes | loss | held-out alpha (T=1) |
|---:|---:|---:|---:|
{rows}

The end-to-end figures (alpha at the bench's sampling settings and at T=1, latency ratio c,
implied speedup) are measured by `python -m sprinter_train stage=draft_eval` and written to
`artifacts/<experiment>/draft_eval.json`.
"""
