"""The generated prefix mixes keep their laws, whichever engine calls produce them.

The `draft` mix is the draft's law and the `target` mix the target's. The `interleaved` mix
is SPRINTER's decoder's prefix: each token is a draft token kept as drawn with probability
alpha, else a target token, independently of the tokens (runs geometric in alpha), so the
joint law of (from_draft flags, tokens) over the first tokens is
prod_t [alpha q(x_t | ...) if drafted else (1 - alpha) p(x_t | ...)]. The old SD-made mix
(`sd_interleaved`) follows the target's law instead, and the same test rejects it.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest

from sprinter_train.core.sampling import SamplingConfig, warp_probs
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.interleaved import InterleavedRuns, run_lengths
from sprinter_train.decoding.policies import SpeculativeDecoding, TargetOnly
from sprinter_train.harvest.continuations import (
    RunLaw,
    build_sequences,
    continuation_engine,
    generation_calls,
)
from sprinter_train.models.roles import Roles
from tests.decoding_helpers import MemoRunner, chi_square_pvalue, enumerate_joint, exact_joint
from tests.harvest_helpers import default_runners, generating_models

VOCAB = 128
PROMPT = [1, 40, 41, 42]
SAMPLING = SamplingConfig(temperature=0.9, top_k=4, top_p=0.95)
RUNS = 3000  # rows of each generated mix
TOKENS = 3  # first tokens whose joint law is compared
# alpha, and a round cap below TOKENS: runs longer than a round must go on unchanged
LAW = RunLaw(accept=0.6, max_run=2)
Outcome = tuple[tuple[bool, ...], tuple[int, ...]]


@pytest.fixture(scope="module")
def models() -> Roles:
    """A tiny target and a draft that disagree often enough for the laws to tell apart."""
    return generating_models("llama", None)


def generated(models: Roles, shared_rows: int) -> dict[str, Counter]:
    """Counts of each mix's (from_draft flags, tokens) over its first TOKENS generated tokens,
    RUNS rows of PROMPT each (rows differ by prompt id, hence by seed), built as the harvest
    builds them."""
    kinds = ("draft", "target", "interleaved", "sd_interleaved")
    mixes = [kinds[i % len(kinds)] for i in range(len(kinds) * RUNS)]
    prompts = [Prompt(f"r{i}", "toy", "train", "", PROMPT, None) for i in range(len(mixes))]
    built = build_sequences(
        models,
        prompts,
        mixes,
        TOKENS,
        TOKENS,
        2,
        LAW,
        SAMPLING,
        0,
        shared_rows,
        runners=default_runners(models),
    )
    counts: dict[str, Counter] = {mix: Counter() for mix in kinds}
    for seq in built:
        start = seq.region_start
        flags = seq.from_draft[start:] or (False,) * TOKENS
        counts[seq.mix][(flags, tuple(seq.input_ids[start:]))] += 1
    return counts


@pytest.fixture(scope="module", params=[0, 4 * RUNS], ids=["own_calls", "shared_call"])
def counts(models, request) -> dict[str, Counter]:
    return generated(models, request.param)


def interleaved_joint(models: Roles, alpha: float) -> dict[Outcome, float]:
    """P(flags, first TOKENS tokens) of the interleaved mix, by enumeration."""
    runners = {role: MemoRunner(getattr(models, role).model, VOCAB) for role in ("draft", "target")}

    def law(role: str, seq: tuple[int, ...]):
        return warp_probs(runners[role]._row(tuple(PROMPT) + seq)[0], SAMPLING)

    out: dict[Outcome, float] = {}
    for flags in itertools.product((False, True), repeat=TOKENS):
        weight = math.prod(alpha if f else 1 - alpha for f in flags)
        joint = enumerate_joint(
            lambda seq, flags=flags: law("draft" if flags[len(seq)] else "target", seq), TOKENS
        )
        out.update({(flags, x): weight * prob for x, prob in joint.items()})
    return out


def tokens_only(counts: Counter | dict) -> dict[tuple[int, ...], float]:
    out: dict[tuple[int, ...], float] = {}
    for (_, x), n in counts.items():
        out[x] = out.get(x, 0) + n
    return out


@pytest.mark.law
def test_draft_and_target_mixes_follow_their_models_law(models, counts) -> None:
    law = {
        role: exact_joint(getattr(models, role).model, PROMPT, TOKENS, SAMPLING, VOCAB)
        for role in ("draft", "target")
    }
    halfway = {k: (law["draft"].get(k, 0.0) + law["target"].get(k, 0.0)) / 2 for k in law["draft"]}
    halfway.update({k: law["target"][k] / 2 for k in law["target"].keys() - law["draft"].keys()})
    for mix in ("draft", "target"):
        observed = tokens_only(counts[mix])
        assert chi_square_pvalue(observed, law[mix]) > 1e-3, mix
        # power: the same counts reject the mixture halfway between the two laws
        assert chi_square_pvalue(observed, halfway) < 1e-6, mix
    assert {flags for flags, _ in counts["draft"]} == {(True,) * TOKENS}
    assert {flags for flags, _ in counts["target"]} == {(False,) * TOKENS}


@pytest.mark.law
def test_interleaved_mix_is_draft_runs_kept_as_drawn_between_target_tokens(models, counts) -> None:
    """Flags and tokens together follow the exact joint: the flags i.i.d. Bernoulli(alpha)
    (runs geometric, also across the max_run cut), independent of the tokens, tokens inside
    a run from q and the token after it from p. The SD-made mix's tokens follow the target's
    law and fail the interleaved law."""
    joint = interleaved_joint(models, LAW.accept)
    assert chi_square_pvalue(counts["interleaved"], joint) > 1e-3
    # the run lengths alone: the first run is geometric (cut at TOKENS)
    first_run = Counter()
    for (flags, _), n in counts["interleaved"].items():
        first_run[((flags + (False,)).index(False),)] += n
    alpha = LAW.accept
    geometric = {(k,): alpha**k * (1 - alpha) for k in range(TOKENS)} | {(TOKENS,): alpha**TOKENS}
    assert chi_square_pvalue(first_run, geometric) > 1e-3
    # the old mix: lossless SD keeps the target's law, which the interleaved law rejects
    marginal = tokens_only(joint)
    target = exact_joint(models.target.model, PROMPT, TOKENS, SAMPLING, VOCAB)
    sd_tokens = tokens_only(counts["sd_interleaved"])
    assert chi_square_pvalue(sd_tokens, target) > 1e-3
    assert chi_square_pvalue(sd_tokens, marginal) < 1e-6
    assert chi_square_pvalue(tokens_only(counts["interleaved"]), marginal) > 1e-3
    # and SD's accepted drafts are not Bernoulli(alpha) flags independent of the tokens
    assert chi_square_pvalue(counts["sd_interleaved"], joint) < 1e-6


def test_run_lengths_are_geometric_by_the_inverse_cdf() -> None:
    """P(N >= n) = alpha^n from uniforms at the boundaries; u = 0 and the limit cut the run."""
    import torch

    alpha = 0.5
    u = torch.tensor([0.0, 0.124, 0.126, 0.26, 0.49, 0.51, 0.999], dtype=torch.float64)
    limit = torch.full((7,), 5)
    assert run_lengths(u, alpha, limit).tolist() == [5, 3, 2, 1, 1, 0, 0]
    assert run_lengths(u, alpha, torch.full((7,), 1)).tolist() == [1, 1, 1, 1, 1, 0, 0]


@pytest.mark.parametrize("max_run", [1, 3])
def test_a_row_is_the_same_alone_and_in_a_batch_of_four(models, max_run: int) -> None:
    """Interleaved rows (prompts of different lengths, runs cut at max_run or not): the tokens
    and the flags of a batch of four equal each row generated alone (float32)."""
    law = RunLaw(accept=0.7, max_run=max_run)
    prompts = [
        Prompt(f"b{i}", "toy", "train", "", [1, *range(40, 42 + 3 * i)], None) for i in range(4)
    ]

    def build(chunk: list[Prompt]) -> list[tuple]:
        built = build_sequences(
            models,
            chunk,
            ["interleaved"] * len(chunk),
            12,
            12,
            2,
            law,
            SAMPLING,
            0,
            runners=default_runners(models),
        )
        return [(seq.input_ids, seq.from_draft) for seq in built]

    together = build(prompts)
    assert together == [build([prompt])[0] for prompt in prompts]
    drafted = [sum(flags) for _, flags in together]
    assert all(0 < d < 12 for d in drafted)


def test_the_engine_calls_and_their_policies(models) -> None:
    """Target rows share the interleaved rows' call and draft nothing; SD rows have their own."""
    mixes = ["target", "interleaved"] * 4
    runners = default_runners(models)
    engine, policy = continuation_engine(models, mixes, 2, LAW, SAMPLING, runners)
    assert isinstance(policy, InterleavedRuns) and policy.drafting == frozenset({1, 3, 5, 7})
    results = engine.generate([PROMPT] * 8, policy, 16, range(8))
    assert all(len(r.tokens) == 16 for r in results)
    assert [sum(r.from_draft) > 0 for r in results] == [False, True] * 4
    engine, policy = continuation_engine(models, ["interleaved"] * 2, 2, LAW, SAMPLING, runners)
    assert isinstance(policy, InterleavedRuns) and policy.drafting is None
    engine, policy = continuation_engine(models, ["sd_interleaved"], 2, LAW, SAMPLING, runners)
    assert isinstance(policy, SpeculativeDecoding) and policy.gamma == 2
    engine, policy = continuation_engine(models, ["target"], 2, LAW, SAMPLING, runners)
    assert isinstance(policy, TargetOnly)
    with pytest.raises(ValueError, match="not generated in one call"):
        continuation_engine(models, ["draft", "target"], 2, LAW, SAMPLING, runners)
    with pytest.raises(ValueError, match="interleaved_accept"):
        continuation_engine(models, ["interleaved"], 2, RunLaw(None, 2), SAMPLING, runners)
    for accept in (0.0, 1.0):
        with pytest.raises(ValueError, match="accept"):
            InterleavedRuns(accept, 2)


@pytest.mark.parametrize(
    ("mixes", "shared_rows", "calls"),
    [
        (["target", "interleaved", "draft", "original", "target"], 3, [[2], [0, 1, 4]]),
        (["target", "interleaved", "draft", "original", "target"], 2, [[2], [0, 4], [1]]),
        (["target", "interleaved", "interleaved"], 0, [[0], [1, 2]]),
        (["target", "target", "original"], 8, [[0, 1]]),
        (["sd_interleaved", "target", "interleaved"], 8, [[1, 2], [0]]),
        (["original"], 8, []),
    ],
)
def test_target_and_interleaved_rows_share_a_call_only_when_few(
    mixes: list[str], shared_rows: int, calls: list[list[int]]
) -> None:
    assert generation_calls(mixes, shared_rows) == calls
