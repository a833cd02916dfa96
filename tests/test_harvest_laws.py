"""The generated prefix mixes keep their models' laws, whichever engine calls produce them.

The `draft` mix is the draft's law, the `target` and `interleaved` mixes the target's (the
interleaved one by lossless speculative decoding, with tokens proposed by both models), also
when a few target and interleaved rows share one call (decoding/shared_call.py).
"""

from __future__ import annotations

from collections import Counter

import pytest

from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.policies import SpeculativeDecoding, TargetOnly
from sprinter_train.decoding.shared_call import SharedTargetRounds
from sprinter_train.harvest.continuations import (
    build_sequences,
    continuation_engine,
    generation_calls,
)
from sprinter_train.models.roles import Roles
from tests.decoding_helpers import chi_square_pvalue, exact_joint
from tests.harvest_helpers import generating_models

VOCAB = 128
PROMPT = [1, 40, 41, 42]
SAMPLING = SamplingConfig(temperature=0.9, top_k=4, top_p=0.95)
RUNS = 3000  # rows of each generated mix
TOKENS = 3  # first tokens whose joint law is compared


@pytest.fixture(scope="module")
def models() -> Roles:
    """A tiny target and a draft that disagree often enough for the laws to tell apart."""
    return generating_models("llama", None)


def first_tokens(models: Roles, shared_rows: int) -> dict[str, Counter]:
    """Counts of each mix's first TOKENS generated tokens over RUNS rows of PROMPT (rows
    differ by prompt id, hence by seed), built as the harvest builds them."""
    mixes = [("draft", "target", "interleaved")[i % 3] for i in range(3 * RUNS)]
    prompts = [Prompt(f"r{i}", "toy", "train", "", PROMPT, None) for i in range(len(mixes))]
    built = build_sequences(models, prompts, mixes, TOKENS, TOKENS, 2, SAMPLING, 0, shared_rows)
    counts: dict[str, Counter] = {mix: Counter() for mix in set(mixes)}
    for seq in built:
        counts[seq.mix][tuple(seq.input_ids[seq.region_start :])] += 1
    return counts


@pytest.mark.law
@pytest.mark.parametrize("shared_rows", [0, 2 * RUNS], ids=["own_calls", "shared_call"])
def test_each_generated_mix_follows_its_models_law(models, shared_rows: int) -> None:
    counts = first_tokens(models, shared_rows)
    law = {
        role: exact_joint(getattr(models, role).model, PROMPT, TOKENS, SAMPLING, VOCAB)
        for role in ("draft", "target")
    }
    outcomes = {*law["draft"], *law["target"]}
    halfway = {k: (law["draft"].get(k, 0.0) + law["target"].get(k, 0.0)) / 2 for k in outcomes}
    for mix, role in [("draft", "draft"), ("target", "target"), ("interleaved", "target")]:
        assert chi_square_pvalue(counts[mix], law[role]) > 1e-3, (mix, role)
        # power: the same counts reject the mixture halfway between the two laws
        assert chi_square_pvalue(counts[mix], halfway) < 1e-6, mix


def test_a_shared_call_drafts_only_in_interleaved_rows(models) -> None:
    """A shared call drafts and keeps exactly what its interleaved rows draft and keep in
    their own call (its target rows never draft), and those rows hold tokens of both models:
    drafts the target kept and drafts it corrected."""
    mixes = ["target", "interleaved"] * 4
    engine, policy = continuation_engine(models, mixes, 2, SAMPLING)
    assert isinstance(policy, SharedTargetRounds) and policy.drafting == frozenset({1, 3, 5, 7})
    shared = engine.generate([PROMPT] * 8, policy, 16, range(8))[0].stats
    engine, policy = continuation_engine(models, ["interleaved"] * 4, 2, SAMPLING)
    assert isinstance(policy, SpeculativeDecoding)
    own = engine.generate([PROMPT] * 4, policy, 16, [1, 3, 5, 7])[0].stats
    assert (shared.drafted, shared.accepted) == (own.drafted, own.accepted)
    assert 0 < own.accepted < own.drafted
    engine, policy = continuation_engine(models, ["target"], 2, SAMPLING)
    assert isinstance(policy, TargetOnly)
    with pytest.raises(ValueError, match="not generated in one call"):
        continuation_engine(models, ["draft", "target"], 2, SAMPLING)


@pytest.mark.parametrize(
    ("mixes", "shared_rows", "calls"),
    [
        (["target", "interleaved", "draft", "original", "target"], 3, [[2], [0, 1, 4]]),
        (["target", "interleaved", "draft", "original", "target"], 2, [[2], [0, 4], [1]]),
        (["target", "interleaved", "interleaved"], 0, [[0], [1, 2]]),
        (["target", "target", "original"], 8, [[0, 1]]),
        (["original"], 8, []),
    ],
)
def test_target_and_interleaved_rows_share_a_call_only_when_few(
    mixes: list[str], shared_rows: int, calls: list[list[int]]
) -> None:
    assert generation_calls(mixes, shared_rows) == calls
