"""The oracle as a bound at every batch size: each round, the better (at the engine's timings)
of a target-only step and drafting exactly what the target keeps plus one; a row whose block
is not drafted gets it a token a round, so the law stays the target's
(sprinter_train/decoding/policies/oracle.py)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from scipy.stats import binomtest

from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.decoding.batch import Batch, Emitted, Round
from sprinter_train.decoding.builder import build_engine, build_runner
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import SpeculativeDecoding, TargetOnly
from sprinter_train.decoding.policies.base import verify
from sprinter_train.decoding.policies.oracle import (
    QUEUE,
    OracleLength,
    drafting_pays,
    drafting_round,
    look_ahead,
    prices,
    unbilled,
)
from sprinter_train.decoding.timings import Timings
from tests.decoding_helpers import (
    GREEDY,
    PACK_EVERY,
    PROMPTS,
    SAMPLING,
    VOCAB,
    FixedLogits,
    assert_target_law_with_power,
    chi_square_pvalue,
    engine_for,
    fixed_timings,
    ragged_rows,
    tiny_trio,
)

SEEDS = [3, 4, 5, 6]
# a target forward that costs the same at any width and a drafting step dearer than it:
# drafting never pays (the target's own token a row is as many tokens for less)
NEVER = fixed_timings(target=lambda rows, width: 1.0, step=lambda rows: 1e6)


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return tiny_trio()


class NaiveOracle(OracleLength):
    """The rule the oracle must not follow: where the look-ahead says drafting does not pay,
    a fresh target draw for every row (the choice then reads the block it throws away)."""

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        limits = batch.room(self.max_gamma)
        if max(limits, default=0) == 0:
            return verify(engine, batch, Round())

        def ahead():
            kept, block = look_ahead(engine, batch, limits)
            return kept, torch.cat([kept[:, None], block], 1).tolist()

        kept, read = unbilled(engine, batch, ahead)
        blocks = [values[1 : values[0] + 2] for values in read]
        if drafting_pays(blocks, limits, len(batch), *prices(engine.timings, len(batch))):
            return drafting_round(engine, batch, limits, kept)
        return verify(engine, batch, Round())


def test_where_drafting_never_pays_the_oracle_only_steps_the_target(models) -> None:
    """Every round a target-only step: nothing drafted or billed to the draft (the look-ahead
    is off the bill), one target call a round, every row's budget emitted; alone, a row emits
    sd(4)'s tokens a token a round, and greedy rows the target's greedy tokens."""
    engine = engine_for(models, SAMPLING, NEVER)
    out = engine.generate(PROMPTS, OracleLength(4), 16, seeds=SEEDS)
    stats = out[0].stats
    assert [len(r.tokens) for r in out] == [16] * len(PROMPTS)
    assert stats.drafted == stats.accepted == stats.draft_calls == stats.drafting_rounds == 0
    assert stats.target_calls == stats.rounds == 16  # a token a row and round
    assert stats.unbilled_draft_seconds > 0 and stats.unbilled_target_seconds > 0
    assert not any(any(r.from_draft) for r in out)  # no token was committed as a draft
    for prompt, seed in zip(PROMPTS, SEEDS, strict=True):
        alone = engine.generate([prompt], OracleLength(4), 16, seeds=[seed])[0].tokens
        sd = engine.generate([prompt], SpeculativeDecoding(4), 16, seeds=[seed])[0].tokens
        assert alone == sd  # the same blocks, delivered a token a round
    greedy = engine_for(models, GREEDY, NEVER)
    reference = greedy.generate(PROMPTS, TargetOnly(), 16)
    assert [r.tokens for r in greedy.generate(PROMPTS, OracleLength(4), 16)] == [
        r.tokens for r in reference
    ]


def test_without_prices_the_oracle_drafts_every_round_and_emits_sds_tokens(models) -> None:
    """Timings with no priors: every round drafts, as before; the tokens are sd(4)'s."""
    engine = engine_for(models, SAMPLING, Timings())
    assert prices(engine.timings, 4) is None
    sd = engine.generate(PROMPTS, SpeculativeDecoding(4), 24, seeds=SEEDS)
    oracle = engine.generate(PROMPTS, OracleLength(4), 24, seeds=SEEDS)
    assert [r.tokens for r in oracle] == [r.tokens for r in sd]
    o, s = oracle[0].stats, sd[0].stats
    assert o.target_calls == s.target_calls and o.accepted == s.accepted
    assert 0 < o.drafted < s.drafted


def test_the_price_decides_each_round_and_a_row_finishing_mid_queue_leaves(models) -> None:
    """Prices where the choice turns on N (a flat target, a drafting step a quarter of it):
    some rounds draft and some do not; rows cut at an EOS met inside a queued block stop
    there, and every row's tokens are its budget or end at the EOS."""
    timings = fixed_timings(target=lambda rows, width: 1.0, step=lambda rows: 0.25)
    eos = engine_for(models, GREEDY).generate([PROMPTS[0]], TargetOnly(), 12)[0].tokens[5]
    engine = engine_for(models, SAMPLING, timings, eos=eos)
    rows = PROMPTS * 4
    out = engine.generate(rows, OracleLength(4), 24, seeds=range(len(rows)))
    stats = out[0].stats
    assert 0 < stats.drafting_rounds < stats.row_rounds  # both kinds of round ran
    for r in out:
        assert len(r.tokens) == 24 or r.tokens[-1] == eos
        assert eos not in r.tokens[:-1]
    assert any(r.tokens[-1] == eos for r in out)


def test_a_block_round_queues_the_rest_and_the_next_rounds_deliver_it(models) -> None:
    """One row alone where drafting never pays: a round whose look-ahead kept drafts emits the
    block's first token and queues the rest; the next rounds are target-only steps emitting
    the queue, a token each, and the round after the queue runs out looks ahead again."""
    engine = engine_for(models, SAMPLING, NEVER)
    oracle = OracleLength(4)
    batch = engine.new_batch([PROMPTS[0]], 24, [0])
    queue: list[int] = []
    while not queue and not batch.rows[0].finished:
        engine.commit(batch, oracle.round(engine, batch), oracle)
        queue = list(batch.rows[0].memory[QUEUE])
    assert queue  # some round's look-ahead kept a draft
    for token in queue:
        engine.commit(batch, oracle.round(engine, batch), oracle)
        assert batch.rows[0].tokens[-1] == token
    assert batch.rows[0].memory[QUEUE] == [] and batch.stats.drafted == 0
    ahead = batch.stats.unbilled_seconds
    engine.commit(batch, oracle.round(engine, batch), oracle)
    assert batch.stats.unbilled_seconds > ahead  # no queue left: the oracle looked ahead


# -- the law ----------------------------------------------------------------------------------


def two_token_engine(sampling: SamplingConfig, timings: Timings) -> Engine:
    """p = (1/2, 1/2) at every position and a draft that always proposes token 0 (q = (1, 0)):
    each draft is kept with probability 1/2, and a rejection's correction is token 1."""
    half, sure = FixedLogits([0.0, 0.0]), FixedLogits([0.0, float("-inf")])
    return build_engine(
        build_runner(half, 2),
        sampling,
        2,
        draft=build_runner(sure, 2),
        pack_every=PACK_EVERY,
        timings=timings,
    )


def counted(engine: Engine, policy, rows: int, batch: int, n: int) -> dict[tuple, int]:
    counts: dict[tuple, int] = {}
    for start in range(0, rows, batch):
        seeds = range(start, start + batch)
        for result in engine.generate([[0]] * batch, policy, n, seeds):
            counts[tuple(result.tokens)] = counts.get(tuple(result.tokens), 0) + 1
    return counts


def test_the_law_holds_where_the_choice_reads_the_blocks_and_the_naive_rule_breaks_it() -> None:
    """Two rows, max_gamma 1, a flat target and a drafting step 3/4 of it: drafting pays only
    when both rows keep their draft (4 tokens over 1.75 against 2 over 1). The oracle's first
    three tokens stay uniform over {0, 1}^3; drawing a fresh token where drafting does not pay
    emits token 0 first with probability 5/8 (a kept draft is 0, and it is kept whenever the
    round drafts)."""
    sampling = SamplingConfig(temperature=1.0)
    timings = fixed_timings(target=lambda rows, width: 1.0, step=lambda rows: 0.75)
    engine = two_token_engine(sampling, timings)
    rows = 800
    uniform = {(a, b, c): 1 / 8 for a in (0, 1) for b in (0, 1) for c in (0, 1)}
    exact = counted(engine, OracleLength(1), rows, 2, 3)
    assert chi_square_pvalue(exact, uniform) > 1e-3
    zeros = sum(v for k, v in exact.items() if k[0] == 0)
    assert binomtest(zeros, rows, 0.5).pvalue > 1e-3
    naive = counted(engine, NaiveOracle(1), rows, 2, 3)
    zeros = sum(v for k, v in naive.items() if k[0] == 0)
    assert binomtest(zeros, rows, 0.5).pvalue < 1e-6 and zeros / rows > 0.58


def first_tokens_in_batches(engine: Engine, policy, rows: list[list[int]], batch: int) -> list:
    """Counts of the first three generated tokens per prompt of PROMPTS, in batches of `batch`
    rows (decoding_helpers.first_tokens' in batches of its own size), row i seeded with i."""
    counts = [Counter() for _ in PROMPTS]
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        out = engine.generate(chunk, policy, 3, range(start, start + len(chunk)))
        for prompt, result in zip(chunk, out, strict=True):
            counts[PROMPTS.index(prompt)][tuple(result.tokens)] += 1
    return counts


@pytest.mark.law
def test_the_oracle_keeps_the_target_law_in_small_batches_whose_choice_flips(models) -> None:
    """Tiny models, batches of 8 (the first prompt and the others in turn), a flat target and a
    drafting step a quarter of it, so rounds draft or not as the rows' N say: the first three
    tokens follow the target's exact law, with power against the draft's (`NaiveOracle` fails
    it: the first prompt's p-value is about 1e-6)."""
    timings = fixed_timings(target=lambda rows, width: 1.0, step=lambda rows: 0.25)
    engine = engine_for(models, SAMPLING, timings)
    rows = ragged_rows(2000)
    counts = first_tokens_in_batches(engine, OracleLength(2), rows, 8)
    assert_target_law_with_power(models, PROMPTS, counts, SAMPLING, VOCAB)
