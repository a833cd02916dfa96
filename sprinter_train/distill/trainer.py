"""The resumable distillation loop: corpus shard -> cached teacher top-k -> student steps.

State (student, optimiser, cursor, tokens, elapsed time, curve) is written atomically at
every shard boundary, so a run killed at any moment loses at most one shard of work and
the same command continues it, in this process or a later one. The state is read with
`weights_only=True`: a state.pt is plain containers and tensors, and unpickling anything else
from a work dir (shared, copied) could run code.
"""

from __future__ import annotations

import json
import logging
import math
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from sprinter_train.core.distributions import acceptance_alpha
from sprinter_train.core.interrupt import note_completed
from sprinter_train.core.io import atomic_write, load_npz
from sprinter_train.distill.losses import distill_loss, slot_map
from sprinter_train.distill.teacher_cache import ensure_teacher_shard, teacher_path
from sprinter_train.models.student import SprinterDraftForCausalLM

log = logging.getLogger(__name__)


@dataclass
class DistillState:
    """Where training stands; saved with the weights."""

    visits: int = 0  # shard visits completed
    shard: int = 0  # corpus position of the shard in training (wraps around: epochs)
    shard_passes: int = 0  # passes already made over that shard
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    curve: list[dict[str, Any]] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)  # where the runs trained, in order


def device_label(device: torch.device) -> str:
    """The machine a run trains on, for the model card (a resumed draft may mix CPU and GPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({torch.get_num_threads()} threads)"


def save_checkpoint(path: Path, student, optimizer, state: DistillState, recipe: dict) -> None:
    payload = {
        "student_config": student.config.to_dict(),
        "student": student.state_dict(),
        "optimizer": optimizer.state_dict(),
        "state": state.__dict__,
        "recipe": recipe,
    }
    atomic_write(path, lambda tmp: torch.save(payload, tmp))
    note_completed("distill state", f"distillation state at {state.tokens:,} tokens ({path})")


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    """The saved state, or None when there is none or it is unreadable (or holds objects other
    than tensors and plain containers, which are never unpickled)."""
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as error:
        log.warning("checkpoint %s is unreadable (%s); starting clean", path, error)
        return None


@torch.no_grad()
def heldout_alpha(student, teacher, tokens: torch.Tensor, batch: int = 8) -> float:
    """Mean sum_x min(p, q) at temperature 1 over held-out positions (full vocabulary)."""
    student.eval()
    total, count = 0.0, 0
    for start in range(0, len(tokens), batch):
        ids = tokens[start : start + batch]
        p = torch.softmax(teacher(input_ids=ids).logits.float(), -1)
        q = torch.softmax(student(input_ids=ids).logits.float(), -1)
        alpha = acceptance_alpha(p, q)
        total += float(alpha.sum())
        count += alpha.numel()
    student.train()
    return total / max(count, 1)


def wait_for_shard(path: Path, producer: Any, poll_seconds: float = 0.5) -> None:
    """Block until the producer process has written `path`; if it died, the caller computes it."""
    while not path.exists() and producer.is_alive():
        time.sleep(poll_seconds)


def lr_at(
    step: int, base_lr: float, warmup: int, remaining: float, decay: float, final: float
) -> float:
    """Linear warm-up, constant, then a linear decay to `final`*lr over the run's last `decay`.

    `step` counts this run's steps and `remaining` is the fraction of this run's time (or
    token) budget still left. Each run ends annealed, which helps a fixed-budget run; a resumed
    run warms up again, since a warm start's fresh Adam moments at the full rate would undo
    part of what the exported weights learned.
    """
    warm = min(1.0, (step + 1) / max(1, warmup))
    anneal = 1.0 if decay <= 0 or remaining >= decay else final + (1 - final) * remaining / decay
    return base_lr * warm * anneal


def train(
    student: SprinterDraftForCausalLM,
    teacher: torch.nn.Module,
    corpus: list[Path],
    teacher_dir: Path,
    checkpoint: Path,
    cfg: dict[str, Any],
    heldout: torch.Tensor,
    device: torch.device,
    resume: dict[str, Any] | None,
    producer: Any | None = None,
) -> DistillState:
    """Train until `max_minutes` of this run or `max_tokens` in total, whichever comes first."""
    optim_cfg, loss_cfg = cfg["optim"], cfg["loss"]
    optimizer = torch.optim.AdamW(
        [p for p in student.parameters() if p.requires_grad],
        lr=optim_cfg["lr"],
        weight_decay=optim_cfg["weight_decay"],
        betas=(0.9, 0.98),
    )
    state = DistillState()
    if resume is not None:
        if resume.get("optimizer") is not None:  # None: warm start from an exported model
            optimizer.load_state_dict(resume["optimizer"])
        state = DistillState(**resume["state"])
        log.info("resuming at %d tokens, %d shard visits", state.tokens, state.visits)
    machine = device_label(device)
    if not state.devices or state.devices[-1] != machine:
        state.devices.append(machine)
    slots = slot_map(student.head_token_ids(), student.config.vocab_size)
    top_k, batch_seqs = int(cfg["teacher"]["top_k"]), int(optim_cfg["batch_sequences"])
    max_tokens = cfg.get("max_tokens") or math.inf
    budget = 60.0 * float(cfg["max_minutes"])
    deadline = time.monotonic() + budget
    first_tokens, first_steps = state.tokens, state.steps
    eval_every = int(cfg["eval_every_shards"])
    passes = int(cfg.get("passes_per_shard", 1))
    student.train()
    bar = tqdm(desc=f"distill {cfg['role']}", unit="tok", unit_scale=True, initial=state.tokens)
    while time.monotonic() < deadline and state.tokens < max_tokens:
        # a teacher pass costs several student passes on CPU: reuse each cached shard a few times
        shard_path = corpus[state.shard % len(corpus)]
        started = time.monotonic()
        tokens = load_npz(shard_path)["tokens"].astype(np.int64)
        if producer is not None:
            wait_for_shard(teacher_path(teacher_dir, shard_path, top_k), producer)
        teacher_shard = ensure_teacher_shard(
            teacher, shard_path, teacher_dir, top_k, cfg["teacher"]["batch_size"], device
        )
        order = np.random.default_rng(state.visits).permutation(len(tokens))
        losses = []
        for start in range(0, len(order), batch_seqs):
            rows = order[start : start + batch_seqs]
            ids = torch.from_numpy(tokens[rows]).to(device)
            logprobs = torch.from_numpy(teacher_shard["logprobs"][rows]).to(device)
            indices = torch.from_numpy(teacher_shard["indices"][rows].astype(np.int64)).to(device)
            hidden = student.model(input_ids=ids).last_hidden_state
            loss, parts = distill_loss(
                student.head_logits(hidden),
                logprobs,
                indices,
                slots,
                loss_cfg["ce_weight"],
                loss_cfg["tv_weight"],
                loss_cfg.get("top1_weight", 0.0),
            )
            for group in optimizer.param_groups:
                left = min(
                    (deadline - time.monotonic()) / budget,
                    1.0 - (state.tokens - first_tokens) / (max_tokens - first_tokens),
                )
                group["lr"] = lr_at(
                    state.steps - first_steps,
                    optim_cfg["lr"],
                    optim_cfg["warmup_steps"],
                    max(0.0, left),
                    optim_cfg.get("decay_fraction", 0.0),
                    optim_cfg.get("final_lr_fraction", 0.1),
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(student.parameters(), optim_cfg["grad_clip"])
            optimizer.step()
            state.steps += 1
            state.tokens += ids.numel()
            losses.append({"loss": float(loss.detach()), **parts})
            bar.update(ids.numel())
        state.visits += 1
        state.shard_passes += 1
        if state.shard_passes >= passes:
            state.shard, state.shard_passes = state.shard + 1, 0
        state.seconds += time.monotonic() - started
        point = {
            "tokens": state.tokens,
            "minutes": round(state.seconds / 60, 2),
            **{k: float(np.mean([x[k] for x in losses])) for k in losses[0]},
        }
        if state.visits % eval_every == 0:
            point["heldout_alpha_t1"] = heldout_alpha(student, teacher, heldout)
        state.curve.append(point)
        bar.set_postfix(
            {
                k: f"{v:.3f}"
                for k, v in point.items()
                if k in ("loss", "overlap_topk", "heldout_alpha_t1")
            }
        )
        log.info("distill %s", json.dumps(point))
        # on a GPU a shard trains in a fraction of the time the whole state takes to write
        last = time.monotonic() >= deadline or state.tokens >= max_tokens
        if last or state.visits % int(cfg.get("save_every_visits", 1)) == 0:
            save_checkpoint(checkpoint, student, optimizer, state, cfg["student"])
    bar.close()
    return state
