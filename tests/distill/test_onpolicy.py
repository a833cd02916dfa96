"""On-policy distillation text and the top-1 loss: real sampling from a tiny target, packed,
resumable, deterministic; the loss term against a brute-force cross-entropy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sprinter_train.core.io import load_npz
from sprinter_train.data.chat import chat_ids
from sprinter_train.distill.losses import distill_loss, slot_map
from sprinter_train.distill.onpolicy import (
    build_generated_corpus,
    mix_shards,
    sample_replies,
)
from sprinter_train.models.tiny import build_tiny_model, build_tiny_tokenizer

SAMPLING = {"temperature": 0.9, "top_k": 0, "top_p": 0.95}


@pytest.fixture(scope="module")
def pair():
    return build_tiny_model({"num_hidden_layers": 2}, seed=3).eval(), build_tiny_tokenizer()


def corpus(pair, folder, max_tokens=64 * 4 * 3):
    model, tokenizer = pair
    return build_generated_corpus(
        model, tokenizer, folder, 64, 4, max_tokens, SAMPLING, max_new_tokens=24, block_prompts=8
    )


def test_replies_follow_their_prompt_and_stop_at_the_first_eos(pair) -> None:
    model, tokenizer = pair
    prompts = [chat_ids(tokenizer, "hello there"), chat_ids(tokenizer, "a much longer question?")]
    out = sample_replies(model, prompts, 2, 2, SAMPLING, 16, seed=0)
    for prompt, sequence in zip(prompts, out, strict=True):
        assert sequence[: len(prompt)] == prompt  # left padding never leaks into a row
        reply = sequence[len(prompt) :]
        assert 1 <= len(reply) <= 16 and 2 not in reply[:-1]
    assert out == sample_replies(model, prompts, 2, 2, SAMPLING, 16, seed=0)
    assert out != sample_replies(model, prompts, 2, 2, SAMPLING, 16, seed=1)


def test_a_row_is_the_model_own_sample(pair) -> None:
    """Greedy: each row's reply is the argmax chain of the unpadded prompt alone."""
    model, tokenizer = pair
    prompts = [chat_ids(tokenizer, "hi"), chat_ids(tokenizer, "tell me more about it")]
    rows = sample_replies(model, prompts, 2, 2, {"temperature": 0}, 6, seed=0)
    for prompt, row in zip(prompts, rows, strict=True):
        ids = list(prompt)
        with torch.no_grad():
            while len(ids) < len(row):
                ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
        assert row == ids[: len(row)]


@pytest.mark.heavy
def test_corpus_is_packed_resumable_and_deterministic(pair, tmp_path) -> None:
    paths = corpus(pair, tmp_path / "g")
    assert len(paths) == 3 and all(p.name.startswith("gen-train-") for p in paths)
    first = [load_npz(p)["tokens"] for p in paths]
    assert all(t.shape == (4, 64) and t.dtype == np.uint16 for t in first)
    paths[-1].unlink()  # a lost shard: its block is sampled again, identically
    again = corpus(pair, tmp_path / "g")
    for before, path in zip(first, again, strict=True):
        np.testing.assert_array_equal(before, load_npz(path)["tokens"])
    fresh = corpus(pair, tmp_path / "h")
    np.testing.assert_array_equal(load_npz(fresh[0])["tokens"], first[0])
    model, tokenizer = pair
    with pytest.raises(ValueError, match="other settings"):
        build_generated_corpus(model, tokenizer, tmp_path / "g", 64, 4, 768, {"temperature": 0.5})


def test_mix_alternates_and_repeats_the_shorter_list(tmp_path) -> None:
    a = [tmp_path / f"a{i}" for i in range(3)]
    b = [tmp_path / "b0"]
    assert mix_shards(a, b) == [a[0], b[0], a[1], b[0], a[2], b[0]]
    assert mix_shards(a, []) == a


def test_top1_term_is_the_cross_entropy_on_the_teacher_argmax() -> None:
    torch.manual_seed(0)
    p_logits, q_logits = torch.randn(6, 10), torch.randn(6, 10)
    logp = torch.log_softmax(p_logits, -1)
    values, indices = logp.topk(4, -1)
    slots = slot_map(torch.arange(10), 10)
    base, _ = distill_loss(q_logits, values, indices, slots, 1.0, 1.0)
    loss, parts = distill_loss(q_logits, values, indices, slots, 1.0, 1.0, top1_weight=0.5)
    argmax = p_logits.argmax(-1)
    brute = -torch.log_softmax(q_logits, -1).gather(1, argmax[:, None]).mean()
    torch.testing.assert_close(torch.tensor(parts["top1_ce"]), brute)
    torch.testing.assert_close(loss, base + 0.5 * brute)
    # a head without the argmax: that position drops out of the term
    head = torch.tensor([i for i in range(10) if i != int(argmax[0])])
    _, parts = distill_loss(
        q_logits[:1, head], values[:1], indices[:1], slot_map(head, 10), 1.0, 1.0, 1.0
    )
    assert parts["top1_ce"] == 0.0
