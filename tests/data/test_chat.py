"""Chat rendering shared by prompts, the distillation corpus and draft_eval's held-out exchanges."""

from __future__ import annotations

from itertools import islice
from typing import Any

import pytest

from sprinter_train.bench.draft.exchanges import heldout_exchanges
from sprinter_train.data.chat import chat_ids, reply_ids
from sprinter_train.data.sharegpt import first_exchanges
from sprinter_train.data.split import split_settings
from sprinter_train.models.tiny import build_tiny_tokenizer

DATA = {"seed": 0, "val_fraction": 0.1, "test_fraction": 0.1}
EVAL = {
    "source": "sharegpt_package",
    "split": "test",
    "num_sequences": 6,
    "seq_len": 64,
    "prompt_fraction": 0.5,
    "max_user_chars": 1000,
    "min_reply_tokens": 8,
}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def test_a_prompt_is_the_head_of_its_exchange_and_the_reply_follows_it(tokenizer) -> None:
    """draft_eval scores prompt + reply tokens; the corpus trains on whole exchanges: the two
    layouts agree up to the end of the reply (the exchange then closes the turn)."""
    prompt = chat_ids(tokenizer, "What is 2 + 2?")
    exchange = chat_ids(tokenizer, "What is 2 + 2?", "It is 4.")
    reply = reply_ids(tokenizer, "It is 4.")
    assert exchange[: len(prompt) + len(reply)] == prompt + reply
    assert len(exchange) > len(prompt) + len(reply)  # the end-of-turn marker


def test_the_user_turn_is_cut_to_max_user_chars(tokenizer) -> None:
    assert chat_ids(tokenizer, "abcdef", max_user_chars=3) == chat_ids(tokenizer, "abc")
    assert chat_ids(tokenizer, "abcdef", "r", 3) == chat_ids(tokenizer, "abc", "r")
    assert chat_ids(tokenizer, "abcdef", max_user_chars=None) == chat_ids(tokenizer, "abcdef")


def exchanges(tokenizer, **overrides: Any) -> list[tuple[list[int], int]]:
    return heldout_exchanges(tokenizer, {**EVAL, **overrides}, DATA)


def test_heldout_exchanges_are_the_splits_first_exchanges_cut_to_size(tokenizer) -> None:
    got = exchanges(tokenizer)
    assert len(got) == EVAL["num_sequences"]
    pairs = islice(first_exchanges("test", split_settings(DATA)), 200)
    expected = []
    for user, reply in pairs:
        prompt = chat_ids(tokenizer, user, max_user_chars=1000)[-32:]
        ids = (prompt + reply_ids(tokenizer, reply))[:64]
        if len(ids) - len(prompt) >= 8:
            expected.append((ids, len(prompt)))
    assert got == expected[: len(got)]
    assert all(len(ids) <= 64 and start <= 32 and len(ids) - start >= 8 for ids, start in got)


def test_heldout_exchanges_follow_the_config(tokenizer) -> None:
    base = exchanges(tokenizer)
    assert exchanges(tokenizer, split="val") != base
    longer = exchanges(tokenizer, seq_len=128, prompt_fraction=0.25)
    assert all(len(ids) <= 128 and start <= 32 for ids, start in longer)
    strict = exchanges(tokenizer, min_reply_tokens=60)
    assert all(len(ids) - start >= 60 for ids, start in strict)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"source": "humaneval_package"}, "no \\(user, reply\\) text exchanges.*sharegpt_package"),
        ({"split": "dev"}, "draft_eval.split must be one of train, val, test"),
        ({"prompt_fraction": 1.0}, "prompt_fraction must lie in \\(0, 1\\)"),
    ],
)
def test_heldout_exchanges_reject_a_bad_config(tokenizer, override, message) -> None:
    with pytest.raises(ValueError, match=message):
        exchanges(tokenizer, **override)
