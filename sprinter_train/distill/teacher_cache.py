"""Cache the teacher's top-k log-probabilities per corpus shard, once, resumably.

The teacher forward is about half the cost of distillation on a CPU; caching lets later
epochs (and later runs) train the student without running the teacher again.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from sprinter_train.core.io import load_npz, save_npz
from sprinter_train.core.processes import die_with_parent


def teacher_path(cache_dir: Path, corpus_shard: Path, top_k: int) -> Path:
    return Path(cache_dir) / f"{corpus_shard.stem}-top{top_k}.npz"


@torch.no_grad()
def teacher_topk(
    model: torch.nn.Module, tokens: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k log-softmax values and ids at every position of a batch of sequences."""
    logits = model(input_ids=tokens).logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    values, indices = logprobs.topk(top_k, dim=-1)
    return values, indices


def ensure_teacher_shard(
    model: torch.nn.Module,
    corpus_shard: Path,
    cache_dir: Path,
    top_k: int,
    batch_size: int,
    device: torch.device,
) -> dict[str, np.ndarray]:
    """Return the cached teacher shard, computing and writing it first if missing or corrupt."""
    path = teacher_path(cache_dir, corpus_shard, top_k)
    cached = load_npz(path)
    if cached is not None:
        return cached
    tokens = load_npz(corpus_shard)
    if tokens is None:
        raise FileNotFoundError(f"corpus shard {corpus_shard} is missing or corrupt")
    ids = torch.from_numpy(tokens["tokens"].astype(np.int64))
    values, indices = [], []
    for start in range(0, len(ids), batch_size):
        v, i = teacher_topk(model, ids[start : start + batch_size].to(device), top_k)
        values.append(v.to(torch.float16).cpu().numpy())
        indices.append(i.cpu().numpy().astype(np.int32))
    shard = {"logprobs": np.concatenate(values), "indices": np.concatenate(indices)}
    save_npz(path, **shard)
    return shard


def produce_teacher_shards(
    spec: dict,
    cache_root: str | None,
    corpus: list[Path],
    cache_dir: Path,
    top_k: int,
    batch_size: int,
    threads: int,
    parent_pid: int,
) -> None:
    """Worker process: fill the teacher cache for `corpus` in order, skipping finished shards.

    On a small CPU two single-threaded processes (teacher here, student in the trainer) get
    about twice the work done of one two-threaded process, so the teacher runs ahead here.
    It dies with `parent_pid` (the distill run): an orphan would fill the cache for days.
    """
    die_with_parent(parent_pid)
    from sprinter_train.models.loading import load_model

    torch.set_num_threads(threads)
    device = torch.device("cpu")
    teacher = load_model(spec, "target", device, torch.float32, cache_root).model
    for shard in corpus:
        ensure_teacher_shard(teacher, shard, cache_dir, top_k, batch_size, device)
