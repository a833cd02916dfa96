"""What a distillation run trains on and starts from: its text, held-out tokens, the student
(resumed, warm-started or new) and, on a CPU, the teacher running ahead in its own process.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from sprinter_train.core.io import load_npz
from sprinter_train.distill.corpus import build_corpus, token_frequencies
from sprinter_train.distill.onpolicy import build_generated_corpus, mix_shards
from sprinter_train.distill.teacher_cache import produce_teacher_shards
from sprinter_train.distill.trainer import heldout_alpha
from sprinter_train.models.loading import LoadedModel
from sprinter_train.models.student import SprinterDraftConfig, SprinterDraftForCausalLM
from sprinter_train.models.student_init import build_student

log = logging.getLogger(__name__)


CORPUS_KINDS = ("replies", "generated", "mix")


def reply_shards(
    cfg: DictConfig,
    ccfg: dict,
    teacher: LoadedModel,
    folder: Path,
    shard_sequences: int,
    sequences: int | None = None,
    split: str = "train",
) -> list[Path]:
    """Shards of `split`'s chat exchanges (`distill.corpus`'s shape): `sequences` of them, or
    corpus.max_tokens' worth."""
    seq_len = ccfg["seq_len"]
    max_tokens = ccfg["max_tokens"] if sequences is None else seq_len * sequences
    return build_corpus(
        teacher.tokenizer,
        folder,
        seq_len,
        shard_sequences,
        max_tokens,
        split_cfg=cfg.data,
        split=split,
        max_user_chars=ccfg["max_user_chars"],
    )


def training_text(cfg: DictConfig, dcfg: dict, teacher: LoadedModel, work: Path) -> list[Path]:
    """The shards training walks: ShareGPT's replies, the target's own sampled replies at the
    experiment's sampling (on-policy), or both in equal parts (`distill.corpus.source`)."""
    ccfg = dcfg["corpus"]
    replies = reply_shards(cfg, ccfg, teacher, work / "corpus", ccfg["shard_sequences"])
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


def heldout_tokens(
    cfg: DictConfig, dcfg: dict, teacher: LoadedModel, work: Path, device: torch.device
) -> torch.Tensor:
    """(eval_sequences, seq_len) token ids of the test split's exchanges: held-out alpha."""
    ccfg, sequences = dcfg["corpus"], dcfg["eval_sequences"]
    paths = reply_shards(cfg, ccfg, teacher, work / "heldout", sequences, sequences, "test")
    return torch.from_numpy(load_npz(paths[0])["tokens"].astype(np.int64)).to(device)


def starting_student(
    resume: dict[str, Any] | None,
    teacher: LoadedModel,
    corpus: list[Path],
    heldout: torch.Tensor,
    dcfg: dict,
    device: torch.device,
) -> SprinterDraftForCausalLM:
    """The student of a saved state, or a new one built from the teacher (its head restricted
    to the corpus's `head_vocab` most frequent tokens when set), on `device`."""
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
    return student


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
