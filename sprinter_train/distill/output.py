"""The distilled model's folder: fp16 weights, tokenizer, modeling code, training state, card.

The folder is what `from_pretrained` loads (with `import sprinter_train`, or
`trust_remote_code=True` without it) and what a run on a fresh machine continues from
(`warm_start`): the optimiser state stays out of git, the weights and state do not.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from sprinter_train.core.io import atomic_write, read_json, write_json
from sprinter_train.core.plots import plot_curve
from sprinter_train.models import student as student_module
from sprinter_train.models.loading import REPO_ROOT, model_title
from sprinter_train.models.student import SprinterDraftForCausalLM

log = logging.getLogger(__name__)


def output_dir(dcfg: dict) -> Path:
    """distill.output_dir; a relative one lies under the repository."""
    path = Path(dcfg["output_dir"]).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


def warm_start(out: Path, dcfg: dict) -> dict[str, Any] | None:
    """Continue from the exported model when the full state is gone (a fresh machine).

    The optimiser state (hundreds of MB) stays out of git; the exported fp16 weights and their
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


def write_output(student, teacher, out: Path, dcfg: dict, state: dict, cfg: DictConfig) -> None:
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
