"""Atomic artifacts and the truncated ShareGPT file."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from sprinter_train.core.io import load_npz, save_npz
from sprinter_train.data.sharegpt import first_user_turn, iter_conversations, sharegpt_json_path

# a conversation object of the shipped file's layout (2-space indent), and whether it is empty
CONVERSATION = re.compile(r'\n  \{\n    "id": "([^"]+)",\n    "conversations": (\[\])?')


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


def test_real_sharegpt_cut_is_found_in_the_last_megabytes(tmp_path) -> None:
    """The shipped file's own cut, on its last 3 MB (three read chunks) instead of all 125 MB:
    every complete conversation before the cut is read, the one the cut runs through is not."""
    path = sharegpt_json_path()
    with open(path, "rb") as handle:
        handle.seek(path.stat().st_size - (3 << 20))
        tail = handle.read().decode("utf-8", errors="replace")
    objects = list(CONVERSATION.finditer(tail))
    piece = tmp_path / "tail.json"
    piece.write_text("[" + tail[objects[0].start() :], encoding="utf-8")
    with pytest.raises(json.JSONDecodeError):
        json.loads(piece.read_text(encoding="utf-8"))  # the slice ends in the file's cut
    got = [c["id"] for c in iter_conversations(piece)]
    whole = [m.group(1) for m in objects[:-1] if m.group(2) is None]  # empty ones are skipped
    assert got == whole and len(got) > 400


@pytest.mark.slow  # reads all 125 MB; the cut itself is tested on the file's tail above
def test_real_sharegpt_parses_about_17k_conversations() -> None:
    count = sum(1 for _ in iter_conversations())
    assert 17_000 < count < 18_500
