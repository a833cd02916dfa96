"""On-policy distillation text: replies the target itself samples at the decoding settings.

The draft is judged on the target's own continuations at the experiment's sampling
(SmolLM2-Instruct's T 0.2, top-p 0.9: nearly greedy); ShareGPT's human-written replies teach it
text the target rarely writes. Prompts are the train split's user turns, so held-out
evaluation never sees them. Each block of `block_prompts` prompts is sampled with its own seed
and packed into shards of the corpus format (uint16 (sequences, seq_len)); a block is the
unit of resume: a finished block's shards are listed in its marker and never regenerated.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase

from sprinter_train.core.io import load_npz, read_json, save_npz, write_json
from sprinter_train.data.chat import chat_ids
from sprinter_train.data.sharegpt import first_exchanges
from sprinter_train.data.split import split_settings

log = logging.getLogger(__name__)


def pad_id_of(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id left padding uses (pads never enter a sequence, so any id does without one)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def block_seed(seed: int, block: int) -> int:
    """The seed of a block of prompts sampled together: distinct per (seed, block), so a rerun
    or a resumed run draws the same replies for that block."""
    return seed * 1_000_003 + block


@torch.no_grad()
def sample_replies(
    model: torch.nn.Module,
    prompts: list[list[int]],
    pad_id: int,
    eos_id: int,
    sampling: dict,
    max_new_tokens: int,
    seed: int,
) -> list[list[int]]:
    """Each prompt followed by the model's sampled reply (through its first EOS, kept).

    Left-padded so every row's reply starts at one column; the pads never enter a sequence.
    """
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    torch.manual_seed(seed)  # generate() draws from the global streams (every device's)
    temperature = float(sampling.get("temperature") or 0)
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        do_sample=temperature > 0,
        temperature=temperature if temperature > 0 else None,
        top_p=float(sampling.get("top_p") or 1.0) if temperature > 0 else None,
        top_k=int(sampling.get("top_k") or 0) if temperature > 0 else None,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
    )
    replies = out[:, width:].cpu().tolist()
    sequences = []
    for prompt, reply in zip(prompts, replies, strict=True):
        end = reply.index(eos_id) + 1 if eos_id in reply else len(reply)
        sequences.append(list(prompt) + reply[:end])
    return sequences


def train_prompts(
    tokenizer: PreTrainedTokenizerBase, split_cfg: dict | None, max_user_chars: int
) -> list[list[int]]:
    """The train split's first user turns, rendered as prompts (the generation header last)."""
    fractions = split_settings(split_cfg or {})
    return [
        chat_ids(tokenizer, user, None, max_user_chars)
        for user, _ in first_exchanges("train", fractions)
        if user.strip()
    ]


def build_generated_corpus(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: Path,
    seq_len: int,
    shard_sequences: int,
    max_tokens: int,
    sampling: dict,
    *,
    split_cfg: dict | None = None,
    max_user_chars: int = 1000,
    max_new_tokens: int = 256,
    block_prompts: int = 256,
    seed: int = 0,
) -> list[Path]:
    """Shards of prompt + sampled reply until `max_tokens`; resumes block by block."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "seq_len": seq_len,
        "shard_sequences": shard_sequences,
        **split_settings(split_cfg or {}),
        "max_user_chars": max_user_chars,
        "max_new_tokens": max_new_tokens,
        "block_prompts": block_prompts,
        "sampling": {k: sampling.get(k) for k in ("temperature", "top_k", "top_p")},
        "seed": seed,
        "vocab": len(tokenizer),
    }
    meta_path = out_dir / "generated.json"
    if meta_path.exists() and read_json(meta_path) != meta:
        raise ValueError(
            f"{out_dir} holds generations made with other settings ({read_json(meta_path)}); "
            "use another distill.work_dir or delete it"
        )
    write_json(meta_path, meta)
    wanted = max(1, max_tokens // (seq_len * shard_sequences))
    prompts = train_prompts(tokenizer, split_cfg, max_user_chars)
    if not prompts:
        raise ValueError("the train split holds no user turns to generate from")
    pad_id = pad_id_of(tokenizer)
    eos_id = int(tokenizer.eos_token_id)
    dtype = np.uint16 if len(tokenizer) <= 65535 else np.int32
    paths: list[Path] = []
    block = 0
    bar = tqdm(total=wanted, desc="on-policy shards", unit="shard")
    while len(paths) < wanted:
        marker = out_dir / f"block-{block:05d}.json"
        names = read_json(marker)["shards"] if marker.exists() else None
        if names is None or any(load_npz(out_dir / n) is None for n in names):
            chunk = [
                prompts[(block * block_prompts + i) % len(prompts)] for i in range(block_prompts)
            ]
            sequences = sample_replies(
                model, chunk, pad_id, eos_id, sampling, max_new_tokens, block_seed(seed, block)
            )
            stream = np.asarray([t for s in sequences for t in s], dtype=dtype)
            names = []
            shard_tokens = seq_len * shard_sequences
            for k in range(len(stream) // shard_tokens):
                name = f"gen-train-{block:05d}-{k:02d}.npz"
                block_tokens = stream[k * shard_tokens : (k + 1) * shard_tokens]
                save_npz(out_dir / name, tokens=block_tokens.reshape(shard_sequences, seq_len))
                names.append(name)
            write_json(marker, {"shards": names, "tokens": int(len(stream))})
        paths.extend(out_dir / n for n in names)
        bar.update(len(names))
        block += 1
        if block > 4 * wanted + 16 and not paths:
            raise ValueError(
                f"{block} blocks of {block_prompts} prompts gave no full shard: raise "
                "block_prompts or max_new_tokens, or lower shard_sequences"
            )
    bar.close()
    log.info("on-policy corpus: %d shards in %d blocks (%s)", wanted, block, out_dir)
    return paths[:wanted]


def mix_shards(first: list[Path], second: list[Path]) -> list[Path]:
    """Alternate two shard lists, the shorter one repeating: training walks the list in order
    (and around it), so every stretch and every epoch sees the two sources in equal parts."""
    if not first or not second:
        return first + second
    n = max(len(first), len(second))
    return [path for i in range(n) for path in (first[i % len(first)], second[i % len(second)])]
