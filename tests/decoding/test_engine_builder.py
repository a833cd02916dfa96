"""decoding/builder.py is the one place that assembles runners and engines from the settings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from sprinter_train.decoding.builder import build_engine, build_runner, runner_layout
from sprinter_train.decoding.engine import Engine
from tests.decoding_helpers import GREEDY, PACK_EVERY, PREFILL_TOKENS, VOCAB, tiny_trio

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
CONF = {"prefill_tokens": PREFILL_TOKENS}  # what runner_layout requires of the section


def trio_engine(layout: dict, **options: int) -> Engine:
    """An engine over the tiny target, draft and companion, each built in `layout` (packed
    every conf's `pack_every` rounds unless `options` says)."""
    trio = tiny_trio()
    return build_engine(
        trio["target"],
        GREEDY,
        VOCAB,
        draft=trio["draft"],
        companion=trio["companion"],
        layout=layout,
        **{"pack_every": PACK_EVERY, **options},
    )


def test_every_role_takes_the_layout_and_the_draft_its_hidden_layer() -> None:
    layout = runner_layout({**CONF, "static_cache": True}, CPU)
    engine = trio_engine(layout, hidden_layer=1, pack_every=3)
    assert {r: x.layout for r, x in engine.present_runners.items()} == dict.fromkeys(
        ("target", "draft", "companion"), "static"
    )
    assert [x.hidden_layer for x in engine.present_runners.values()] == [-1, 1, -1]
    assert engine.pack_every == 3 and engine.companion is not None


def test_compile_drafts_false_leaves_the_drafts_uncompiled_and_captured_on_cuda() -> None:
    cuda = torch.device("cuda")  # the layout is worked out for a device, none is used
    compiled = {**CONF, "compile": True, "compile_drafts": False}
    assert runner_layout(compiled, cuda)["drafts"] == {"compiled": False, "captured": True}
    assert runner_layout({**compiled, "capture": False}, cuda)["drafts"] == {
        "compiled": False,
        "captured": False,
    }
    kept = (
        {**CONF, "compile": True},
        {**compiled, "compile_drafts": True},
        {**compiled, "compile": False},
    )
    assert [runner_layout(settings, cuda)["drafts"] for settings in kept] == [{}, {}, {}]
    engine = trio_engine(runner_layout(compiled, CPU))
    assert {r: x.compiled for r, x in engine.present_runners.items()} == {
        "target": True,
        "draft": False,
        "companion": False,
    }


def test_no_layout_is_the_runners_own_default_and_a_built_runner_is_kept() -> None:
    trio = tiny_trio()
    target = build_runner(trio["target"], VOCAB, {"static": True})
    engine = build_engine(target, GREEDY, VOCAB, draft=trio["draft"], pack_every=PACK_EVERY)
    assert engine.target is target and engine.target.layout == "static"
    assert engine.draft is not None and engine.draft.layout == "dynamic"  # the CPU default
    assert engine.companion is None and list(engine.present_runners) == ["target", "draft"]


def test_pack_every_and_a_padded_prefills_budget_have_no_default_in_code() -> None:
    """conf/config.yaml is the one place decoding.pack_every and decoding.prefill_tokens are
    written: an engine without `pack_every`, a decoding section without `prefill_tokens` and
    a layout that pads its prefill without it are refused; a prefill by length needs none."""
    trio = tiny_trio()
    with pytest.raises(TypeError, match="pack_every"):
        build_engine(trio["target"], GREEDY, VOCAB)
    with pytest.raises(ValueError, match="decoding.prefill_tokens is not set"):
        runner_layout({"static_cache": True}, CPU)
    with pytest.raises(ValueError, match="sets no prefill_tokens"):
        build_runner(trio["draft"], VOCAB, {"padded_prefill": True}, role="draft")
    padded = build_runner(trio["target"], VOCAB, {**CONF, "padded_prefill": True})
    assert padded.padded_prefill and padded.prefill_tokens == PREFILL_TOKENS
    assert build_runner(trio["target"], VOCAB).prefill_tokens is None  # by length on a CPU


def test_runners_are_built_in_the_decoding_package_only() -> None:
    """Outside decoding/, code asks the builder for runners (tests may build them directly)."""
    call = re.compile(r"\bModelRunner\(")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("sprinter_train", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "decoding" not in path.relative_to(ROOT).parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if call.search(line)
    ]
    assert not found, found
