"""The exact first-token law of SV's rules against the target's: by hand on the smallest case,
zero for the exact sv, and sv_paper's computed law against the engine's own samples."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from sprinter_train.bench.quality.law_distance import (
    first_token_law,
    first_token_tv,
    next_token_laws,
)
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.decoding.builder import build_engine, build_runner
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import SpecVerification, SpecVerificationPaper
from sprinter_train.models.tiny import build_tiny_model
from tests.decoding_helpers import (
    PACK_EVERY,
    ATable,
    ByA,
    chi_square_pvalue,
    fixed_timings,
    noisy_copy,
    smallest_case_engine,
)

VOCAB = 128
SAMPLING = SamplingConfig(temperature=0.2)  # random tiny models are flat: sharpen them
PROMPTS = [[5, 17, 9, 33], [40, 41, 42, 43, 44, 45, 46], [7, 8]]


def policy(paper: bool, table) -> SpecVerification | SpecVerificationPaper:
    """The rule, pricing at the engine's timings (the tests' `fixed_timings`)."""
    kind = SpecVerificationPaper if paper else SpecVerification
    return kind(table, max_gamma=4)


def test_the_law_formula_by_hand() -> None:
    p, q = torch.tensor([0.6, 0.4, 0.0]), torch.tensor([0.2, 0.5, 0.3])
    everything = torch.ones(3, dtype=torch.bool)
    assert torch.allclose(first_token_law(p, q, everything), p.double())  # speculative sampling
    assert torch.allclose(first_token_law(p, q, ~everything), p.double())  # nothing drafted
    # keep only token 1: q(1) = 0.5 kept, accepted with 0.8 (0.4 of mass), 0.1 goes to the
    # residual, which is all on token 0; tokens 0 and 2 (0.5 of mass) are dropped and go to p
    law = first_token_law(p, q, torch.tensor([False, True, False]))
    assert law.tolist() == pytest.approx([0.1 + 0.5 * 0.6, 0.4 + 0.5 * 0.4, 0.0])


def test_the_smallest_case_is_three_quarters_against_one_half() -> None:
    """p = q = (1/2, 1/2), c = (1, 0): sv_paper emits token 0 with 3/4 (TV 1/4), sv keeps p."""
    engine = smallest_case_engine(SamplingConfig(temperature=1.0))
    assert first_token_tv(engine, policy(True, ByA()), [[0]]) == [pytest.approx(0.25)]
    assert first_token_tv(engine, policy(False, ByA()), [[0]]) == [pytest.approx(0.0, abs=1e-12)]


@pytest.fixture(scope="module")
def engine() -> Engine:
    target = build_tiny_model({}, seed=0)
    return build_engine(
        build_runner(target, VOCAB),
        SAMPLING,
        VOCAB,
        draft=build_runner(noisy_copy(target, 0.01, 1), VOCAB),
        # near enough to the draft that S and A spread over (0, 1): the rule's A matters
        companion=build_runner(noisy_copy(target, 0.03, 2), VOCAB),
        pack_every=PACK_EVERY,
        timings=fixed_timings(),
    )


def test_exact_sv_is_at_distance_zero_and_the_paper_rule_is_not(engine) -> None:
    exact = first_token_tv(engine, policy(False, ATable()), PROMPTS)
    paper = first_token_tv(engine, policy(True, ATable()), PROMPTS)
    assert max(exact) < 1e-6
    assert min(paper) > 0.05


@pytest.mark.law
def test_the_paper_rules_law_matches_the_engines_samples(engine) -> None:
    """20k first tokens from the engine under sv_paper follow the computed law, not p, and
    their Monte-Carlo TV from p agrees with the computed one. The estimate is P_hat(M) - p(M)
    on M = {t: P(t) > p(t)}: unbiased, where the empirical law's own TV from p would be
    inflated by the sampling noise of ~100 cells."""
    rule = policy(True, ATable())
    laws = next_token_laws(engine, PROMPTS[:1])
    p, q, c = (laws[role][0].double() for role in ("target", "draft", "companion"))
    law = first_token_law(p, q, rule.first_draft_keeps(engine, PROMPTS[0], q.float(), c.float()))
    runs, batch = 20000, 2000
    counts: Counter = Counter()
    for start in range(0, runs, batch):
        seeds = range(start, start + batch)
        for result in engine.generate([PROMPTS[0]] * batch, rule, 2, seeds):
            counts[(result.tokens[0],)] += 1
    computed = {(x,): v for x, v in enumerate(law.tolist()) if v > 0}
    target = {(x,): v for x, v in enumerate(p.tolist()) if v > 0}
    assert chi_square_pvalue(counts, computed) > 1e-3
    assert chi_square_pvalue(counts, target) < 1e-6
    tv = first_token_tv(engine, rule, PROMPTS[:1])[0]
    assert tv == pytest.approx(0.5 * float((law - p).abs().sum()))
    more = (law > p).nonzero().flatten().tolist()
    share = sum(counts[(x,)] for x in more) / runs
    sigma = (share * (1 - share) / runs) ** 0.5
    assert share - float(p[more].sum()) == pytest.approx(tv, abs=4 * sigma)
