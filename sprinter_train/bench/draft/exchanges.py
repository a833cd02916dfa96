"""The exchanges draft_eval scores a draft on: held-out text pairs or the target's own replies.

An exchange is a chat-rendered user turn cut to its last seq_len * prompt_fraction tokens,
then the reply, seq_len tokens in all; alpha is read at the reply's positions. Text sources
come from data/exchanges.py; `target_replies` samples the target on ShareGPT's user turns.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import islice
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from sprinter_train.data.chat import chat_ids, reply_ids
from sprinter_train.data.exchanges import EXCHANGE_SOURCES, FIXED_SPLITS
from sprinter_train.data.split import SPLITS, split_settings
from sprinter_train.distill.onpolicy import block_seed, pad_id_of, sample_replies
from sprinter_train.models.loading import LoadedModel

TARGET_REPLIES = "target_replies"
# every draft_eval.source / extra_sources value: the text sources, then the target's own replies
SOURCES = (*EXCHANGE_SOURCES, TARGET_REPLIES)
Exchange = tuple[list[int], int]  # (token ids, index of the first reply token)


def check_sources(ecfg: Mapping[str, Any]) -> list[str]:
    """`source`, then each of `extra_sources` not already listed; refuses an unknown name
    before any model loads."""
    extras = [("extra_sources", str(s)) for s in ecfg.get("extra_sources") or []]
    named = [("source", str(ecfg["source"])), *extras]
    for key, name in named:
        if name not in SOURCES:
            raise ValueError(
                f"draft_eval.{key} names {name!r}, which has no (user, reply) exchanges; "
                f"choose from {', '.join(SOURCES)}"
            )
    return list(dict.fromkeys(name for _, name in named))


def source_split(source: str, ecfg: Mapping[str, Any]) -> str:
    """The split a source's exchanges come from (HumanEval: all of it, see data/exchanges.py)."""
    return FIXED_SPLITS.get(source, str(ecfg["split"]))


def exchange_shape(ecfg: Mapping[str, Any]) -> tuple[int, int]:
    """(seq_len, tokens the prompt keeps) after checking split and prompt_fraction."""
    split = str(ecfg["split"])
    if split not in SPLITS:
        raise ValueError(f"draft_eval.split must be one of {', '.join(SPLITS)}, got {split!r}")
    seq_len, fraction = int(ecfg["seq_len"]), float(ecfg["prompt_fraction"])
    if not 0 < fraction < 1:
        raise ValueError(f"draft_eval.prompt_fraction must lie in (0, 1), got {fraction}")
    return seq_len, max(1, int(seq_len * fraction))


def heldout_exchanges(
    tokenizer: PreTrainedTokenizerBase,
    ecfg: Mapping[str, Any],
    data_cfg: Mapping[str, Any],
    source: str | None = None,
) -> list[Exchange]:
    """(token ids, index of the first reply token) of `num_sequences` exchanges of `source`
    (default `draft_eval.source`) from `split` (split by id as `data` splits): the
    chat-rendered user turn, cut to its last seq_len * prompt_fraction tokens, then the reply,
    seq_len tokens in all; exchanges with fewer than `min_reply_tokens` reply tokens left are
    skipped. Text sources only: target_replies needs the target (`target_exchanges`)."""
    source = str(ecfg["source"]) if source is None else source
    if source not in EXCHANGE_SOURCES:
        raise ValueError(
            f"draft_eval.source={source!r} has no (user, reply) text exchanges; choose from "
            f"{', '.join(EXCHANGE_SOURCES)} (or {TARGET_REPLIES}, sampled from the target)"
        )
    seq_len, keep = exchange_shape(ecfg)
    out: list[Exchange] = []
    for user, reply in EXCHANGE_SOURCES[source](str(ecfg["split"]), split_settings(data_cfg)):
        prompt = chat_ids(tokenizer, user, max_user_chars=ecfg["max_user_chars"])[-keep:]
        ids = (prompt + reply_ids(tokenizer, reply))[:seq_len]
        if len(ids) - len(prompt) >= int(ecfg["min_reply_tokens"]):
            out.append((ids, len(prompt)))
        if len(out) >= int(ecfg["num_sequences"]):
            break
    return out


def target_exchanges(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    ecfg: Mapping[str, Any],
    data_cfg: Mapping[str, Any],
    sampling: Mapping[str, Any],
) -> list[Exchange]:
    """Exchanges whose reply is the target's own sample at `sampling`, the text speculative
    decoding meets (the draft learnt from human replies): ShareGPT's `split` user turns in
    order, prompts cut as in `heldout_exchanges`, each reply drawn (through its first EOS) up
    to the seq_len tokens the exchange holds. Prompts go in blocks of the exchanges still
    missing, block b seeded with `block_seed(seed, b)`, so a run reproduces its replies."""
    seq_len, keep = exchange_shape(ecfg)
    wanted, shortest = int(ecfg["num_sequences"]), int(ecfg["min_reply_tokens"])
    users = EXCHANGE_SOURCES["sharegpt_package"](str(ecfg["split"]), split_settings(data_cfg))
    prompts = (
        chat_ids(tokenizer, u, max_user_chars=ecfg["max_user_chars"])[-keep:] for u, _ in users
    )
    pad_id = pad_id_of(tokenizer)
    out: list[Exchange] = []
    block = 0
    while len(out) < wanted:
        chunk = list(islice(prompts, wanted - len(out)))
        if not chunk:
            break
        rows = sample_replies(
            model,
            chunk,
            pad_id,
            int(tokenizer.eos_token_id),
            dict(sampling),
            seq_len - min(len(p) for p in chunk),
            block_seed(int(ecfg.get("seed", 0)), block),
        )
        for prompt, row in zip(chunk, rows, strict=True):
            if min(len(row), seq_len) - len(prompt) >= shortest:
                out.append((row[:seq_len], len(prompt)))
        block += 1
    return out


def source_exchanges(
    source: str, target: LoadedModel, ecfg: Mapping[str, Any], cfg: DictConfig
) -> list[Exchange]:
    """One source's exchanges: text pairs tokenised, or replies sampled from the target."""
    if source == TARGET_REPLIES:
        sampling = OmegaConf.to_container(cfg.sampling, resolve=True)
        return target_exchanges(target.model, target.tokenizer, ecfg, cfg.data, sampling)
    return heldout_exchanges(target.tokenizer, ecfg, cfg.data, source)
