"""Atomic artifacts and the truncated ShareGPT file."""

from __future__ import annotations

import json

import numpy as np

from sprinter_train.core.io import load_npz, save_npz
from sprinter_train.data.sharegpt import first_user_turn, iter_conversations


def test_truncated_shard_is_detected(tmp_path) -> None:
    path = save_npz(tmp_path / "a.npz", x=np.arange(1000))
    assert load_npz(path) is not None
    path.write_bytes(path.read_bytes()[:300])
    assert load_npz(path) is None
    assert not list(tmp_path.glob(".*tmp*"))


def test_sharegpt_reader_stops_cleanly_at_a_cut(tmp_path) -> None:
    items = [
        {
            "id": f"c{i}_0",
            "conversations": [
                {"from": "human", "value": f"question {i}"},
                {"from": "gpt", "value": "answer " * 50},
            ],
        }
        for i in range(40)
    ]
    text = json.dumps(items, indent=2)
    cut = tmp_path / "cut.json"
    cut.write_text(text[: len(text) * 3 // 4])  # cut in the middle of an object
    got = list(iter_conversations(cut))
    assert 20 < len(got) < 40
    assert [first_user_turn(c) for c in got] == [f"question {i}" for i in range(len(got))]


def test_real_sharegpt_parses_about_17k_conversations() -> None:
    count = sum(1 for _ in iter_conversations())
    assert 17_000 < count < 18_500
