"""The distillation corpus: train split only, deterministic, resumable, not rebuilt needlessly."""

from __future__ import annotations

import numpy as np

from sprinter_train.core.io import load_npz
from sprinter_train.distill.corpus import build_corpus, token_frequencies
from sprinter_train.models.tiny import build_tiny_tokenizer


def test_corpus_is_deterministic_and_a_lost_shard_is_rebuilt_identically(tmp_path) -> None:
    tokenizer = build_tiny_tokenizer()
    args = (tokenizer, tmp_path / "c", 64, 8, 64 * 8 * 3)
    paths = build_corpus(*args)
    assert [p.name for p in paths] == ["train-00000.npz", "train-00001.npz", "train-00002.npz"]
    first = [load_npz(p)["tokens"] for p in paths]
    paths[1].unlink()
    again = build_corpus(*args)
    for before, path in zip(first, again, strict=True):
        np.testing.assert_array_equal(before, load_npz(path)["tokens"])
    counts = token_frequencies(again, len(tokenizer))
    assert counts.sum() == 64 * 8 * 3


def test_train_and_test_corpora_differ(tmp_path) -> None:
    tokenizer = build_tiny_tokenizer()
    train = build_corpus(tokenizer, tmp_path / "a", 64, 4, 256)
    test = build_corpus(tokenizer, tmp_path / "b", 64, 4, 256, split="test")
    assert not np.array_equal(load_npz(train[0])["tokens"], load_npz(test[0])["tokens"])
