"""Tokenise ShareGPT (user, assistant) exchanges into fixed-length shards for distillation.

Only conversations in the `train` split are used, so draft evaluation on held-out
ShareGPT text never sees training text. Shards are uint16/int32 arrays of shape
(sequences, seq_len) with deterministic names; a finished shard is never rewritten.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerBase

from sprinter_train.core.io import load_npz, read_json, save_npz, write_json
from sprinter_train.data.chat import chat_ids
from sprinter_train.data.sharegpt import assistant_turns, iter_split_conversations
from sprinter_train.data.split import split_settings

log = logging.getLogger(__name__)

CORPUS_SOURCE = "sharegpt_package"  # the data source (conf/data) whose conversations it reads


def iter_token_stream(
    tokenizer: PreTrainedTokenizerBase, split: str, fractions: dict[str, float], max_user_chars: int
) -> Iterator[list[int]]:
    """Token ids of every exchange in `split` (fractions: seed, val_fraction, test_fraction), as
    the chat template renders it, user turn shortened (its tokens matter less)."""
    for conversation in iter_split_conversations(split, fractions):
        for user, reply in assistant_turns(conversation):
            yield chat_ids(tokenizer, user, reply, max_user_chars)


def build_corpus(
    tokenizer: PreTrainedTokenizerBase,
    out_dir: Path,
    seq_len: int,
    shard_sequences: int,
    max_tokens: int,
    split_cfg: dict[str, float] | None = None,
    split: str = "train",
    max_user_chars: int = 1000,
) -> list[Path]:
    """Pack the token stream into shards until `max_tokens`; resumes by skipping finished shards."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta_path = out_dir / "corpus.json"
    fractions = split_settings(split_cfg or {})
    meta = {
        "seq_len": seq_len,
        "shard_sequences": shard_sequences,
        **fractions,
        "split": split,
        "max_user_chars": max_user_chars,
        "vocab": len(tokenizer),
    }
    shard_tokens = seq_len * shard_sequences
    n_shards = max(1, max_tokens // shard_tokens)
    if meta_path.exists():
        old = read_json(meta_path)
        if {k: old.get(k) for k in meta} != meta:
            raise ValueError(
                f"{out_dir} holds a corpus built with other settings ({old}); "
                "use another distill.work_dir or delete it"
            )
        # a finished build records how many shards the source gave; no need to re-read it
        n_shards = min(n_shards, int(old.get("shards", n_shards)))
    paths = [out_dir / f"{split}-{i:05d}.npz" for i in range(n_shards)]
    if all(load_npz(p) is not None for p in paths):
        return paths
    dtype = np.uint16 if len(tokenizer) <= 65535 else np.int32
    buffer: list[int] = []
    shard = 0
    for ids in iter_token_stream(tokenizer, split, fractions, max_user_chars):
        buffer.extend(ids)
        while len(buffer) >= shard_tokens and shard < n_shards:
            block = np.asarray(buffer[:shard_tokens], dtype=dtype).reshape(shard_sequences, seq_len)
            del buffer[:shard_tokens]
            if load_npz(paths[shard]) is None:
                save_npz(paths[shard], tokens=block)
            shard += 1
        if shard >= n_shards:
            break
    if shard < n_shards:
        log.warning("ShareGPT %s split ran out after %d of %d shards", split, shard, n_shards)
        paths = paths[:shard]
    write_json(meta_path, {**meta, "shards": len(paths)})
    return paths


def token_frequencies(paths: list[Path], vocab_size: int) -> np.ndarray:
    """Counts of each token id over the corpus: picks the restricted head's token set."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for path in paths:
        shard = load_npz(path)
        if shard is not None:
            counts += np.bincount(
                shard["tokens"].reshape(-1).astype(np.int64), minlength=vocab_size
            )[:vocab_size]
    return counts
