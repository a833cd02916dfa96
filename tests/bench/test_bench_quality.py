"""ROUGE-L against a brute-force LCS and hand-worked values; perplexity against token-by-token."""

from __future__ import annotations

import copy
import itertools
import math
import random

import pytest
import torch

from sprinter_train.bench.quality.scores import lcs_length, rouge_l, target_perplexity, tokenize
from sprinter_train.models.tiny import build_tiny_model


@pytest.fixture(autouse=True)
def _small_torch() -> None:
    """Overrides conftest's 2 threads: the tiny models' matmuls stall on a busy shared core."""
    torch.set_num_threads(1)


def _is_subsequence(sub: tuple[str, ...], seq: list[str]) -> bool:
    items = iter(seq)
    return all(token in items for token in sub)


def _brute_lcs(a: list[str], b: list[str]) -> int:
    """Longest subsequence of `a` (all 2^len(a) of them) that is also one of `b`."""
    for size in range(len(a), 0, -1):
        if any(_is_subsequence(sub, b) for sub in itertools.combinations(a, size)):
            return size
    return 0


def _random_pairs(count: int) -> list[tuple[list[str], list[str]]]:
    rng = random.Random(1234)
    vocab = ["x", "y", "z"]
    return [
        (
            [rng.choice(vocab) for _ in range(rng.randint(0, 8))],
            [rng.choice(vocab) for _ in range(rng.randint(0, 8))],
        )
        for _ in range(count)
    ]


def test_lcs_matches_brute_force() -> None:
    for a, b in _random_pairs(300):
        expected = _brute_lcs(a, b)
        assert lcs_length(a, b) == expected, (a, b)
        assert lcs_length(b, a) == expected, (b, a)


def test_rouge_l_matches_brute_force_f1() -> None:
    for a, b in _random_pairs(200):
        common = _brute_lcs(a, b)
        if not a and not b:
            expected = 1.0  # two empty outputs are the same output
        elif not a or not b or common == 0:
            expected = 0.0
        else:
            p, r = common / len(a), common / len(b)
            expected = 2 * p * r / (p + r)
        assert rouge_l(" ".join(a), " ".join(b)) == pytest.approx(expected), (a, b)


def test_rouge_l_hand_values() -> None:
    assert rouge_l("The cat sat.", "the CAT sat") == 1.0
    assert rouge_l("alpha beta", "gamma delta") == 0.0
    assert rouge_l("", "anything") == 0.0
    assert rouge_l("anything", "  ...  ") == 0.0
    # LCS(the cat sat on the mat, the cat is on the mat) = 5 of 6 on both sides: P = R = 5/6.
    assert rouge_l("the cat sat on the mat", "the cat is on the mat") == pytest.approx(5 / 6)
    # LCS = a b c: P = 3/3, R = 3/6, F = 2 * 1 * 0.5 / 1.5 = 2/3.
    assert rouge_l("A, b; c!", "a x b y c z") == pytest.approx(2 / 3)


def test_rouge_l_of_identical_outputs_is_one() -> None:
    """An output scores 1 against itself whatever it holds: a tiny model's outputs often hold
    no word token, and target_only scored 66.7 against itself (issue 39, item 2)."""
    rng = random.Random(7)
    alphabet = ["a", "B", " ", ".", "!", "\n", "é", "_", "  ", "?!"]
    texts = ["", " ", "...", "!?", "\n\n", "a", "the cat."]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(200)]
    for text in texts:
        assert rouge_l(text, text) == 1.0, repr(text)
    assert rouge_l("...", "!!!") == 0.0  # different outputs without words still differ
    assert rouge_l("", "...") == 0.0


def test_rouge_l_agrees_with_rouge_score_on_ascii() -> None:
    rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    pairs = [
        ("The quick brown fox jumps over the lazy dog.", "A quick brown dog jumps over a lazy fox"),
        ("speculative decoding drafts tokens", "decoding drafts many speculative tokens fast"),
        ("1 2 3 4 5", "5 4 3 2 1"),
    ]
    for candidate, reference in pairs:
        expected = scorer.score(reference, candidate)["rougeL"].fmeasure
        assert rouge_l(candidate, reference) == pytest.approx(expected)


def test_tokenize_lowercases_words() -> None:
    assert tokenize("Hello, World! it's 42") == ["hello", "world", "it", "s", "42"]


@pytest.fixture(scope="module")
def tiny_model() -> torch.nn.Module:
    return build_tiny_model({}, seed=0)


def _manual_perplexity(model: torch.nn.Module, context: list[int], output: list[int]) -> float:
    """One forward per output token over the growing prefix, no cache."""
    nll = 0.0
    with torch.no_grad():
        for i, token in enumerate(output):
            prefix = torch.tensor([context + output[:i]])
            logits = model(input_ids=prefix, use_cache=False).logits[0, -1].double()
            nll -= torch.log_softmax(logits, dim=-1)[token].item()
    return math.exp(nll / len(output))


def test_perplexity_matches_token_by_token(tiny_model: torch.nn.Module) -> None:
    gen = torch.Generator().manual_seed(7)
    for context_len, output_len in [(1, 1), (5, 7), (12, 3)]:
        ids = torch.randint(3, 128, (context_len + output_len,), generator=gen).tolist()
        context, output = ids[:context_len], ids[context_len:]
        got = target_perplexity(tiny_model, context, output)
        assert got == pytest.approx(_manual_perplexity(tiny_model, context, output), rel=1e-4)


def test_perplexity_depends_on_context_and_output(tiny_model: torch.nn.Module) -> None:
    context, output = [5, 17, 40, 41], [60, 61, 62]
    base = target_perplexity(tiny_model, context, output)
    assert base != pytest.approx(target_perplexity(tiny_model, [9, 9, 9, 9], output), rel=1e-3)
    assert base != pytest.approx(target_perplexity(tiny_model, context, [61, 60, 62]), rel=1e-3)


def test_perplexity_empty_output_is_nan(tiny_model: torch.nn.Module) -> None:
    assert math.isnan(target_perplexity(tiny_model, [1, 2, 3], []))


def test_perplexity_bfloat16_close_to_float32(tiny_model: torch.nn.Module) -> None:
    half = copy.deepcopy(tiny_model).to(torch.bfloat16)
    context, output = [1, 30, 31, 32, 33], [40, 50, 60, 70, 80, 90]
    full_ppl = target_perplexity(tiny_model, context, output)
    half_ppl = target_perplexity(half, context, output)
    assert math.isfinite(half_ppl)
    assert half_ppl == pytest.approx(full_ppl, rel=0.05)


def test_perplexity_without_context_scores_from_second_token(tiny_model: torch.nn.Module) -> None:
    output = [20, 21, 22, 23]
    expected = target_perplexity(tiny_model, output[:1], output[1:])
    assert target_perplexity(tiny_model, [], output) == pytest.approx(expected)
    assert math.isnan(target_perplexity(tiny_model, [], [20]))
