"""draft_eval's exchange sources: HumanEval problems, the target's own replies, and the
by-source report, on tiny models."""

from __future__ import annotations

import gzip
import json
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
import torch

from sprinter_train.__main__ import run_stage
from sprinter_train.bench.draft.exchanges import check_sources, heldout_exchanges, target_exchanges
from sprinter_train.data.chat import chat_ids, reply_ids
from sprinter_train.data.prompts import humaneval_json_path
from sprinter_train.data.sharegpt import first_exchanges
from sprinter_train.data.split import split_settings
from sprinter_train.models.tiny import build_tiny_model, build_tiny_tokenizer

DATA = {"seed": 0, "val_fraction": 0.1, "test_fraction": 0.1}
EVAL = {
    "source": "sharegpt_package",
    "split": "test",
    "num_sequences": 5,
    "seq_len": 48,
    "prompt_fraction": 0.5,
    "max_user_chars": 1000,
    "min_reply_tokens": 4,
    "seed": 0,
}
GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0}
SAMPLED = {"temperature": 0.9, "top_k": 0, "top_p": 0.95}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def target():
    return build_tiny_model({"num_hidden_layers": 2}, seed=1)


def replies(tokenizer, target, sampling: dict[str, Any], **overrides: Any):
    return target_exchanges(target, tokenizer, {**EVAL, **overrides}, DATA, sampling)


def test_humaneval_exchanges_are_the_problems_and_their_solutions_in_file_order(
    tokenizer,
) -> None:
    cfg = {**EVAL, "source": "humaneval", "num_sequences": 4, "min_reply_tokens": 1}
    got = heldout_exchanges(tokenizer, cfg, DATA)
    with gzip.open(humaneval_json_path(), "rt", encoding="utf-8") as handle:
        problems = [json.loads(line) for line in islice(handle, 4)]
    expected = []
    for problem in problems:
        prompt = chat_ids(tokenizer, problem["prompt"], max_user_chars=1000)[-24:]
        ids = (prompt + reply_ids(tokenizer, problem["canonical_solution"]))[:48]
        expected.append((ids, len(prompt)))
    assert got == expected
    # every problem is unseen by the draft: the split does not pick among them
    assert heldout_exchanges(tokenizer, {**cfg, "split": "val"}, DATA) == got


def test_target_replies_follow_the_held_out_user_turns_and_are_the_argmax_chain(
    tokenizer, target
) -> None:
    """Greedy: each reply is the target's argmax chain from its unpadded prompt alone, through
    its first EOS or up to seq_len."""
    got = replies(tokenizer, target, GREEDY, seq_len=160, prompt_fraction=0.75)
    assert len(got) == EVAL["num_sequences"]
    users = [u for u, _ in islice(first_exchanges("test", split_settings(DATA)), 40)]
    prompts = [chat_ids(tokenizer, u, max_user_chars=1000)[-120:] for u in users]
    assert len({len(ids[:start]) for ids, start in got}) > 1  # left padding is exercised
    position = 0
    eos = tokenizer.eos_token_id
    for ids, start in got:
        while prompts[position] != ids[:start]:  # skipped turns gave too short a reply
            position += 1
        position += 1
        chain = ids[:start]
        with torch.no_grad():
            while len(chain) < len(ids):
                chain.append(int(target(input_ids=torch.tensor([chain])).logits[0, -1].argmax()))
        assert ids == chain
        assert len(ids) == 160 or ids[-1] == eos
        assert eos not in ids[start:-1] and len(ids) - start >= EVAL["min_reply_tokens"]


def test_target_replies_too_short_for_the_exchange_are_replaced_by_the_next_turns(
    tokenizer, target
) -> None:
    """A prompt cut to 120 tokens leaves 40 reply tokens in 160: with 41 required it is skipped
    and later blocks draw from the following turns until the count is reached."""
    got = replies(tokenizer, target, GREEDY, seq_len=160, prompt_fraction=0.75, min_reply_tokens=41)
    assert len(got) == EVAL["num_sequences"]
    users = [u for u, _ in islice(first_exchanges("test", split_settings(DATA)), 40)]
    prompts = [chat_ids(tokenizer, u, max_user_chars=1000)[-120:] for u in users]
    assert any(len(p) == 120 for p in prompts[: EVAL["num_sequences"]])  # the first block skips
    short = [p for p in prompts if len(p) < 120]
    assert [ids[:start] for ids, start in got] == short[: EVAL["num_sequences"]]


def test_target_replies_are_sampled_reproducibly_from_the_seed(tokenizer, target) -> None:
    first = replies(tokenizer, target, SAMPLED)
    assert first == replies(tokenizer, target, SAMPLED)
    assert first != replies(tokenizer, target, SAMPLED, seed=1)
    assert first != replies(tokenizer, target, GREEDY)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"source": "gsm8k"}, "draft_eval.source names 'gsm8k'.*sharegpt_package, humaneval"),
        (
            {"extra_sources": ["humaneval", "mt_bench"]},
            "draft_eval.extra_sources names 'mt_bench'.*humaneval, target_replies",
        ),
    ],
)
def test_an_unknown_source_is_refused_with_the_choices(overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        check_sources({**EVAL, **overrides})


def test_sources_are_the_main_one_then_the_extras_once_each() -> None:
    cfg = {**EVAL, "extra_sources": ["target_replies", "sharegpt_package", "humaneval"]}
    assert check_sources(cfg) == ["sharegpt_package", "target_replies", "humaneval"]
    assert check_sources({**EVAL, "extra_sources": None}) == ["sharegpt_package"]


def test_heldout_exchanges_send_target_replies_to_the_target(tokenizer) -> None:
    with pytest.raises(ValueError, match="text exchanges.*target_replies, sampled from the target"):
        heldout_exchanges(tokenizer, {**EVAL, "source": "target_replies"}, DATA)


def test_draft_eval_reports_every_source_beside_the_main_one(
    compose_cfg, tmp_path: Path, capsys
) -> None:
    cfg = compose_cfg(
        "stage=draft_eval",
        "models=tiny_random",
        "experiment=tiny",
        "draft_eval.extra_sources=[humaneval,target_replies]",
        "draft_eval.num_sequences=3",
        "draft_eval.seq_len=40",
        "draft_eval.min_reply_tokens=4",
        "draft_eval.latency_reps=2",
        "draft_eval.gammas=[1]",
        "draft_eval.context_tokens=8",
        "draft_eval.floor_reps=2",
    )
    result = run_stage(cfg)
    saved = json.loads((Path(cfg.experiment_dir) / "draft_eval.json").read_text())
    by_source = saved["by_source"]  # the file sorts its keys; the run keeps the main one first
    assert list(result["by_source"]) == ["sharegpt_package", "humaneval", "target_replies"]
    assert set(by_source) == set(result["by_source"])
    assert [by_source[s]["split"] for s in result["by_source"]] == ["test", "all", "test"]
    main = by_source["sharegpt_package"]
    assert main["alpha"] == saved["alpha"] == result["alpha"]
    assert main["alpha_by_setting"] == saved["alpha_by_setting"]
    assert main["greedy_agreement"] == saved["greedy_agreement"]
    assert (main["positions"], main["sequences"]) == (saved["positions"], saved["sequences"])
    for entry in by_source.values():
        assert set(entry["alpha_by_setting"]) == {"default", "T=1"}
        assert 0 < entry["alpha"] < 1 and 0 <= entry["greedy_agreement"] <= 1
        assert entry["sequences"] == 3 and entry["positions"] > 0
    assert by_source["humaneval"]["alpha"] != by_source["target_replies"]["alpha"]
    printed = capsys.readouterr().out
    assert "source (split)" in printed and "humaneval (all)" in printed
    assert "target_replies (test)" in printed


def test_an_unknown_extra_source_stops_draft_eval_before_any_model_loads(compose_cfg) -> None:
    cfg = compose_cfg(
        "stage=draft_eval", "models.target.path=/nonexistent", "draft_eval.extra_sources=[x]"
    )
    with pytest.raises(ValueError, match="draft_eval.extra_sources names 'x'"):
        run_stage(cfg)
