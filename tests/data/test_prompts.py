"""load_prompts: deterministic id-based splits, caps, left truncation, and every source.

The offline sources read the installed packages (fast); the hub source is faked by
monkeypatching `datasets.load_dataset`, so no test touches the network.
"""

from __future__ import annotations

import logging
import re
from itertools import islice
from pathlib import Path
from typing import Any

import datasets
import pytest
from omegaconf import OmegaConf

from sprinter_train.data.online import prefix_split
from sprinter_train.data.prompts import (
    SOURCES,
    Prompt,
    PromptSourceError,
    conversation_key,
    load_prompts,
)
from sprinter_train.data.sharegpt import first_user_turn, iter_conversations
from sprinter_train.data.split import split_of
from sprinter_train.models.tiny import build_tiny_tokenizer

DATA_CONF = Path(__file__).resolve().parents[2] / "conf" / "data"
LOGGER = "sprinter_train.data.prompts"
BASE = {"seed": 0, "val_fraction": 0.1, "test_fraction": 0.1, "max_prompt_tokens": None}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def sharegpt_cfg(**overrides: Any) -> dict[str, Any]:
    return {
        **BASE,
        "name": "sharegpt",
        "source": "sharegpt_package",
        "num_prompts": 30,
        **overrides,
    }


def humaneval_cfg(**overrides: Any) -> dict[str, Any]:
    return {
        **BASE,
        "name": "humaneval",
        "source": "humaneval_package",
        "num_prompts": None,
        **overrides,
    }


def hf_cfg(**overrides: Any) -> dict[str, Any]:
    return {
        **BASE,
        "name": "fake",
        "source": "hf",
        "num_prompts": None,
        "hf_path": "fake/set",
        **overrides,
    }


def fake_hub(monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Make datasets.load_dataset return `rows`; returns the list of calls it received."""
    calls: list[dict[str, Any]] = []

    def load_dataset(path: str, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        calls.append({"path": path, "args": args, **kwargs})
        return list(rows)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def chat_ids(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def signature(prompts: list[Prompt]) -> list[tuple[str, str, list[int]]]:
    return [(p.prompt_id, p.split, p.input_ids) for p in prompts]


# --- determinism and splits -------------------------------------------------------------


def test_same_config_gives_identical_prompts(tokenizer) -> None:
    first = load_prompts(sharegpt_cfg(), tokenizer)
    second = load_prompts(OmegaConf.create(sharegpt_cfg()), tokenizer)  # DictConfig works too
    assert len(first) == 30
    assert signature(first) == signature(second)
    assert [p.text for p in first] == [p.text for p in second]


def test_split_is_split_of_the_id_and_the_seed_changes_it(tokenizer) -> None:
    seed0 = load_prompts(sharegpt_cfg(num_prompts=100), tokenizer)
    seed1 = load_prompts(sharegpt_cfg(num_prompts=100, seed=1), tokenizer)
    assert all(p.split == split_of(p.prompt_id, 0, 0.1, 0.1) for p in seed0)
    assert all(p.split == split_of(p.prompt_id, 1, 0.1, 0.1) for p in seed1)
    assert [p.prompt_id for p in seed0] == [p.prompt_id for p in seed1]  # same source order
    assert [p.split for p in seed0] != [p.split for p in seed1]
    assert {p.split for p in seed0} == {"train", "val", "test"}


def test_fractions_from_the_config_are_used(tokenizer) -> None:
    prompts = load_prompts(humaneval_cfg(val_fraction=0.3, test_fraction=0.4), tokenizer)
    assert all(p.split == split_of(p.prompt_id, 0, 0.3, 0.4) for p in prompts)


def test_split_filter_then_cap_in_source_order(tokenizer) -> None:
    every = load_prompts(humaneval_cfg(), tokenizer)
    val = load_prompts(humaneval_cfg(num_prompts=5), tokenizer, split="val")
    assert [p.split for p in val] == ["val"] * 5
    assert [p.prompt_id for p in val] == [p.prompt_id for p in every if p.split == "val"][:5]
    all_test = load_prompts(humaneval_cfg(num_prompts=0), tokenizer, split="test")
    assert [p.prompt_id for p in all_test] == [p.prompt_id for p in every if p.split == "test"]


def test_cap_larger_than_the_split_returns_the_whole_split(tokenizer) -> None:
    every = load_prompts(humaneval_cfg(), tokenizer)
    test = load_prompts(humaneval_cfg(num_prompts=10_000), tokenizer, split="test")
    assert len(test) == sum(p.split == "test" for p in every) > 0


def test_bad_split_and_bad_cap_are_refused(tokenizer) -> None:
    with pytest.raises(ValueError, match="train, val, test"):
        load_prompts(humaneval_cfg(), tokenizer, split="dev")
    with pytest.raises(ValueError, match="num_prompts"):
        load_prompts(humaneval_cfg(num_prompts=-1), tokenizer)


def test_unknown_source_lists_the_valid_ones(tokenizer) -> None:
    with pytest.raises(ValueError, match="unknown data source") as info:
        load_prompts(humaneval_cfg(source="nope"), tokenizer)
    for source in ("sharegpt_package", "humaneval_package", "hf"):
        assert source in str(info.value)


# --- truncation -------------------------------------------------------------------------


def test_long_prompts_keep_their_tail_and_warn_once(tokenizer, caplog) -> None:
    full = load_prompts(humaneval_cfg(), tokenizer)
    limit = 40
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cut = load_prompts(humaneval_cfg(max_prompt_tokens=limit), tokenizer)
    long = sum(len(p.input_ids) > limit for p in full)
    assert long > 0
    for before, after in zip(full, cut, strict=True):
        assert after.input_ids == before.input_ids[-limit:]
        assert after.text == before.text
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == LOGGER]
    assert len(warnings) == 1
    assert f"{long} of {len(full)}" in warnings[0].getMessage()


def test_max_context_wins_when_smaller(tokenizer) -> None:
    prompts = load_prompts(humaneval_cfg(max_prompt_tokens=1000), tokenizer, max_context=25)
    assert max(len(p.input_ids) for p in prompts) == 25
    prompts = load_prompts(humaneval_cfg(max_prompt_tokens=25), tokenizer, max_context=1000)
    assert max(len(p.input_ids) for p in prompts) == 25


def test_no_warning_when_nothing_is_cut(tokenizer, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        load_prompts(humaneval_cfg(max_prompt_tokens=100_000), tokenizer)
    assert not [r for r in caplog.records if r.name == LOGGER]


# --- offline sources --------------------------------------------------------------------


def test_humaneval_loads_all_164_problems_as_plain_text(tokenizer) -> None:
    prompts = load_prompts(humaneval_cfg(), tokenizer)
    assert len(prompts) == 164
    assert [p.prompt_id for p in prompts] == [f"HumanEval/{i}" for i in range(164)]
    first = prompts[0]
    assert first.dataset == "humaneval"
    assert (
        first.text.startswith("from typing import List") and "def has_close_elements" in first.text
    )
    assert first.reference is not None and "return" in first.reference
    assert first.input_ids == tokenizer(first.text)["input_ids"]  # no chat template
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") not in first.input_ids


def test_sharegpt_ids_have_no_chunk_suffix_and_text_is_the_first_user_turn(tokenizer) -> None:
    prompts = load_prompts(sharegpt_cfg(num_prompts=200), tokenizer)
    ids = [p.prompt_id for p in prompts]
    assert len(ids) == len(set(ids)) == 200
    assert not any(re.search(r"_\d+$", i) or "_" in i for i in ids)
    first_chunks = {}
    for conversation in islice(iter_conversations(), 2000):
        first_chunks.setdefault(str(conversation["id"]).split("_")[0], conversation)
    for prompt in prompts:
        conversation = first_chunks[prompt.prompt_id]
        assert str(conversation["id"]) == f"{prompt.prompt_id}_0"
        assert prompt.text == first_user_turn(conversation)
        assert prompt.input_ids == chat_ids(tokenizer, prompt.text)
    assert sum(p.reference is not None for p in prompts) > 190


def test_sharegpt_split_matches_the_distillation_corpus_key(tokenizer) -> None:
    """distill_corpus/draft_eval split on str(id).split("_")[0]: test prompts never leak."""
    conversation = next(iter_conversations())
    assert conversation_key(conversation) == str(conversation["id"]).split("_")[0]
    for prompt in load_prompts(sharegpt_cfg(num_prompts=50), tokenizer, split="test"):
        assert split_of(prompt.prompt_id, 0) == "test"


# --- hub source (faked) -----------------------------------------------------------------


def test_unreachable_hub_names_the_offline_datasets(tokenizer, monkeypatch) -> None:
    def offline(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("no route to huggingface.co")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(PromptSourceError) as info:
        load_prompts(hf_cfg(), tokenizer)
    assert "data=sharegpt" in str(info.value) and "data=humaneval" in str(info.value)
    assert isinstance(info.value.__cause__, ConnectionError)


def test_hub_failing_while_streaming_is_a_prompt_source_error(tokenizer, monkeypatch) -> None:
    def rows() -> Any:
        yield {"text": "one two three four"}
        raise OSError("connection reset")

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: rows())
    with pytest.raises(PromptSourceError, match="data=sharegpt"):
        load_prompts(hf_cfg(), tokenizer)


def test_prefix_rule_gives_thirty_percent_of_the_words(tokenizer, monkeypatch) -> None:
    texts = [
        " ".join(f"w{i}" for i in range(10)),
        "The quick  brown fox jumps over\nthe lazy dog near the river bank today",
        "single",  # too short to split: skipped
        " ".join(f"x{i}" for i in range(20)),
    ]
    calls = fake_hub(monkeypatch, [{"text": t, "other": 1} for t in texts])
    prompts = load_prompts(hf_cfg(hf_name="cfg", hf_split="test"), tokenizer)
    assert (
        calls[0]["path"] == "fake/set" and calls[0]["name"] == "cfg" and calls[0]["split"] == "test"
    )
    assert [p.prompt_id for p in prompts] == ["0", "1", "3"]  # ids are row positions
    assert [len(p.text.split()) for p in prompts] == [3, 4, 6]  # round(0.3 x 10, 14, 20 words)
    for prompt, text in zip(prompts, [texts[0], texts[1], texts[3]], strict=True):
        assert prompt.text + prompt.reference == text
        assert prompt.text.split() + prompt.reference.split() == text.split()
        assert prompt.input_ids == tokenizer(prompt.text)["input_ids"]  # continuation, no chat
    assert prompts[0].text == "w0 w1 w2" and prompts[0].reference == " w3 w4 w5 w6 w7 w8 w9"


def test_prefix_fraction_is_configurable() -> None:
    text = " ".join(str(i) for i in range(10))
    assert prefix_split(text, 0.5) == ("0 1 2 3 4", " 5 6 7 8 9")
    assert prefix_split("a b", 0.01) == ("a", " b")  # at least one word each side
    assert prefix_split("a b", 0.99) == ("a", " b")
    assert prefix_split("   ", 0.3) is None
    with pytest.raises(ValueError):
        prefix_split(text, 1.0)


def test_prompt_field_takes_the_first_turn_and_the_chat_template(tokenizer, monkeypatch) -> None:
    rows = [
        {"qid": 7, "turns": ["First question?", "Follow-up?"], "answer": ["42"]},
        {"qid": 9, "turns": ["Another one?"], "answer": []},
        {"qid": 11, "turns": [], "answer": ["dropped"]},  # no prompt: skipped
    ]
    fake_hub(monkeypatch, rows)
    cfg = hf_cfg(prompt_field="turns", reference_field="answer", id_field="qid")
    prompts = load_prompts(cfg, tokenizer)
    assert [(p.prompt_id, p.text, p.reference) for p in prompts] == [
        ("7", "First question?", "42"),
        ("9", "Another one?", None),
    ]
    assert prompts[0].input_ids == chat_ids(tokenizer, "First question?")


def test_two_prompts_with_one_id_are_refused(tokenizer, monkeypatch) -> None:
    """A local jsonl whose rows share an id was harvested under one id: one random stream,
    one cluster in the bootstrap. It is refused, naming the id."""
    rows = [{"qid": 7, "turns": ["First?"]}, {"qid": 7, "turns": ["Second?"]}]
    fake_hub(monkeypatch, rows)
    cfg = hf_cfg(prompt_field="turns", id_field="qid")
    with pytest.raises(ValueError, match="two prompts have the id '7'"):
        load_prompts(cfg, tokenizer)


def test_prompt_format_wraps_the_prompt(tokenizer, monkeypatch) -> None:
    fake_hub(monkeypatch, [{"article": "Some news.", "highlights": "News."}])
    cfg = hf_cfg(
        prompt_field="article", reference_field="highlights", prompt_format="{text}\nSummarize."
    )
    (prompt,) = load_prompts(cfg, tokenizer)
    assert (prompt.text, prompt.reference) == ("Some news.\nSummarize.", "News.")


def test_missing_field_names_the_columns(tokenizer, monkeypatch) -> None:
    fake_hub(monkeypatch, [{"body": "a b c d"}])
    with pytest.raises(KeyError, match="body"):
        load_prompts(hf_cfg(text_field="text"), tokenizer)


# --- the shipped configs ----------------------------------------------------------------

DATA_YAMLS = sorted(DATA_CONF.glob("*.yaml"))


@pytest.mark.parametrize("path", DATA_YAMLS, ids=lambda p: p.stem)
def test_data_yaml_has_the_common_keys(path: Path) -> None:
    cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    assert path.read_text().startswith("# python -m sprinter_train stage=")
    assert f"data={path.stem}" in path.read_text().splitlines()[0]
    for key in (
        "name",
        "source",
        "num_prompts",
        "seed",
        "val_fraction",
        "test_fraction",
        "max_prompt_tokens",
    ):
        assert key in cfg, key
    assert cfg["source"] in SOURCES
    if cfg["source"] == "hf":
        assert cfg["hf_path"]
        assert cfg.get("prompt_field") or cfg.get("text_field")


@pytest.mark.parametrize(
    "path", [p for p in DATA_YAMLS if "source: hf" in p.read_text()], ids=lambda p: p.stem
)
def test_hub_yaml_reaches_load_dataset_with_its_settings(
    tokenizer, monkeypatch, path: Path
) -> None:
    cfg = OmegaConf.load(path)
    field = cfg.get("prompt_field") or cfg.get("text_field")
    row = {field: "alpha beta gamma delta epsilon", "question_id": 1, "prompt_id": 2, "id": "x"}
    for extra in ("reference_field",):
        if cfg.get(extra):
            row[cfg[extra]] = "ref"
    calls = fake_hub(monkeypatch, [row])
    prompts = load_prompts(cfg, tokenizer)
    assert len(prompts) == 1 and prompts[0].dataset == cfg.name
    call = calls[0]
    assert call["path"] == cfg.hf_path and call["streaming"] is True
    for key, arg in (("hf_name", "name"), ("hf_split", "split"), ("hf_revision", "revision")):
        if cfg.get(key) is not None:
            assert call[arg] == cfg[key]
