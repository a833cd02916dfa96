"""The batched cache: every row's logits equal a full forward of that row's tokens alone,
through ragged appends, rejected drafts, packing and rows leaving the batch."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from sprinter_train.decoding.builder import build_runner
from sprinter_train.decoding.cache.rows import DynamicRowCache
from sprinter_train.decoding.cache.static import StaticRowCache
from sprinter_train.decoding.runner.runner import ModelRunner
from sprinter_train.models.static_kv import StaticKV
from sprinter_train.models.tiny import build_tiny_model
from tests.decoding_helpers import feed_rows

VOCAB = 128


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return build_tiny_model({"num_hidden_layers": 2}, seed=1).float()


def full_logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens])).logits[0, :, :VOCAB].float()


def feed(runner: ModelRunner, cache, rows: list[list[int]]) -> torch.Tensor:
    """Append rows[r] to row r; (rows, width, V) logits at every fed offset."""
    return feed_rows(runner, cache, rows).logits


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_ragged_appends_rejections_packing_and_leaving_rows(model, static) -> None:
    """Both layouts; the static one keeps its slot map in device buffers (`SlotMappedKV`),
    its rows leaving into a smaller bucket."""
    runner = build_runner(model, VOCAB, {"static": static})
    seqs = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    cache = runner.new_cache(len(seqs))
    assert isinstance(cache, StaticRowCache) == static
    rng = torch.Generator().manual_seed(0)
    out = feed(runner, cache, seqs)
    for r, seq in enumerate(seqs):
        torch.testing.assert_close(out[r, : len(seq)], full_logits(model, seq), atol=1e-4, rtol=0)
    for step in range(8):
        new = [
            torch.randint(
                3, VOCAB, (int(torch.randint(0, 4, (1,), generator=rng)),), generator=rng
            ).tolist()
            for _ in seqs
        ]
        out = feed(runner, cache, new)
        for r, tokens in enumerate(new):
            seqs[r] += tokens
            if tokens:
                expected = full_logits(model, seqs[r])[-len(tokens) :]
                torch.testing.assert_close(out[r, : len(tokens)], expected, atol=1e-4, rtol=0)
        # reject up to two of each row's tokens: their slots become holes
        drop = torch.randint(0, 3, (len(seqs),), generator=rng)
        cache.truncate(torch.tensor([len(s) for s in seqs]) - drop)
        seqs = [s[: len(s) - int(d)] for s, d in zip(seqs, drop, strict=True)]
        assert cache.lengths.tolist() == [len(s) for s in seqs]
        if step == 3:
            cache.pack(max(map(len, seqs)))
            assert cache.slots == max(map(len, seqs))
        if step == 5:
            cache.select(torch.tensor([2, 0]))
            seqs = [seqs[2], seqs[0]]


def test_a_row_alone_gives_the_same_logits_as_in_a_batch(model) -> None:
    runner = build_runner(model, VOCAB)
    alone, batch = runner.new_cache(1), runner.new_cache(3)
    prompt = [20, 21, 22, 23]
    solo = feed(runner, alone, [prompt])[0, :4]
    mixed = feed(runner, batch, [[30, 31], prompt, [40, 41, 42, 43, 44, 45]])[1, :4]
    torch.testing.assert_close(solo, mixed, atol=1e-5, rtol=0)


def test_priming_rows_one_at_a_time_equals_a_full_forward(model) -> None:
    """An empty cache filled row by row (no padding compute), then extended in a batch."""
    runner = build_runner(model, VOCAB)
    seqs = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15]]
    cache = runner.new_cache(len(seqs))
    runner.prime(cache, [s[:-1] for s in seqs])
    assert cache.lengths.tolist() == [6, 0, 2]
    out = feed(runner, cache, [s[-1:] + [20, 21] for s in seqs])
    for r, seq in enumerate(seqs):
        full = full_logits(model, seq + [20, 21])[-3:]
        torch.testing.assert_close(out[r, :3], full, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", [DynamicCache, StaticKV])
def test_a_pack_from_the_settled_slots_puts_every_slot_where_a_full_pack_does(kind) -> None:
    """The engine's caches (`truncate` with the committed tokens as floor, `pack` with the
    shortest row) against the same caches packed in full: equal keys, values and positions."""
    gen = torch.Generator().manual_seed(0)
    heads, dim, layers = 2, 4, 2
    prefix = [5, 3, 4]

    def block(rows: int, width: int) -> list[torch.Tensor]:
        return [torch.randn(rows, heads, width, dim, generator=gen) for _ in range(2 * layers)]

    primed = []
    for n in prefix:
        row, kv = DynamicCache(), block(1, n)
        for layer in range(layers):
            row.update(kv[2 * layer], kv[2 * layer + 1], layer)
        primed.append(row)
    settled, full = (
        DynamicRowCache(3, torch.device("cpu"), kind()),
        DynamicRowCache(3, torch.device("cpu"), kind()),
    )
    for cache in (settled, full):
        cache.absorb([([r], row) for r, row in enumerate(primed)], prefix)
    committed = list(prefix)
    for step in range(12):
        rows = len(committed)
        counts = torch.randint(1, 4, (rows,), generator=gen)
        new = block(rows, 3)
        for cache in (settled, full):
            for layer in range(layers):
                cache.kv.update(new[2 * layer], new[2 * layer + 1], layer)
            cache.append(counts, 3)
        valid = torch.tensor(committed) + (counts * torch.rand(rows, generator=gen)).long()
        settled.truncate(valid, min(committed))
        full.truncate(valid)
        committed = valid.tolist()
        if step == 6:  # a row leaves, another is repeated
            for cache in (settled, full):
                cache.select(torch.tensor([2, 0, 0]))
            committed = [committed[2], committed[0], committed[0]]
        if step % 3 == 2:
            settled.pack(max(committed), min(committed))
            full.pack(max(committed))
            assert settled.slots == max(committed)
        assert torch.equal(settled.position, full.position)
        for mine, reference in zip(settled.kv.layers, full.kv.layers, strict=True):
            assert torch.equal(mine.keys, reference.keys)
            assert torch.equal(mine.values, reference.values)
