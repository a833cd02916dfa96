"""The oracle length (issue 38 item 4): a row drafts exactly what the target keeps plus the
draft it rejects, emits sd's tokens at its gamma (so the target's law), is billed only for
that, and results.md says what share of its gain each length policy takes. The engines here
have no prices (`Timings()`), so every round drafts; tests/decoding/test_oracle_bound.py
has the rounds where a target-only step pays more."""

from __future__ import annotations

import pytest
import torch

from sprinter_train.bench.report.oracle import ORACLE, oracle_section, oracle_shares
from sprinter_train.bench.report.summary import draft_runs
from sprinter_train.core.config import compose_config
from sprinter_train.decoding.policies import SpeculativeDecoding
from sprinter_train.decoding.policies.oracle import OracleLength, oracle_uniforms
from sprinter_train.decoding.policies.registry import as_record, greedy_exact, traits_of
from sprinter_train.decoding.timings import Timings
from tests.decoding_helpers import GREEDY, PROMPTS, SAMPLING, engine_for, tiny_trio

SEEDS = [3, 4, 5, 6]


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return tiny_trio()


def test_the_check_reads_the_numbers_sds_check_read() -> None:
    """Room 3: sd tests its drafts with numbers 3, 4, 5 and draws with 6; after 2 real drafts
    the oracle's row stands at number 2, so it tests with 3, 4 and draws with 6."""
    u = torch.arange(20, dtype=torch.float64)[None, :].repeat(3, 1)  # u[r, j]: the row's j-th next
    room, kept = torch.tensor([3, 3, 0]), torch.tensor([2, 3, 0])
    out = oracle_uniforms(u, room, kept, 3)
    assert out[0, :3].tolist() == [1.0, 2.0, 4.0]  # numbers 3, 4 and 6, from number 2 on
    assert out[1].tolist() == [0.0, 1.0, 2.0, 3.0]  # all three drafts: numbers 3..6
    assert out[2, 0].item() == 0.0  # no draft: the draw takes the round's first number


@pytest.mark.parametrize("sampling", [SAMPLING, GREEDY], ids=["sampled", "greedy"])
def test_the_oracle_emits_sds_tokens_and_pays_only_up_to_the_first_rejection(
    models, sampling
) -> None:
    """Same seeds: the oracle at max_gamma 4 emits sd(4)'s tokens row for row (the target's
    law, as sd's), in as many target calls, drafting fewer; every one of its rejecting rounds
    drafted exactly one token past what was kept; its look-ahead is off the bill."""
    engine = engine_for(models, sampling, Timings())  # no prices: every round drafts
    sd = engine.generate(PROMPTS, SpeculativeDecoding(4), 24, seeds=SEEDS)
    oracle = engine.generate(PROMPTS, OracleLength(4), 24, seeds=SEEDS)
    assert [r.tokens for r in oracle] == [r.tokens for r in sd]
    o, s = oracle[0].stats, sd[0].stats
    assert o.target_calls == s.target_calls and o.accepted == s.accepted
    assert o.drafted <= s.drafted and o.draft_calls <= s.draft_calls
    runs = draft_runs(o)
    if sampling is SAMPLING:
        assert o.drafted < s.drafted  # some draft was rejected, and the oracle did not draw past it
        assert runs["oracle_gap"] == 1.0
    assert o.unbilled_seconds > 0 and o.unbilled_target_seconds > 0
    assert o.unbilled_draft_seconds > 0
    assert o.target_seconds > 0  # the real rounds' forwards stay billed


def test_the_oracle_emits_more_a_round_than_sd_at_a_lower_gamma(models) -> None:
    """Over 32 rows, the oracle at max_gamma 4 emits more tokens a row's round than sd(1)
    (its expected 1 + a + ... + a^4 against 1 + a)."""
    engine = engine_for(models, SAMPLING, Timings())
    rows, seeds = PROMPTS * 8, list(range(32))

    def per_round(policy) -> float:
        results = engine.generate(rows, policy, 24, seeds=seeds)
        return sum(len(r.tokens) for r in results) / results[0].stats.row_rounds

    assert per_round(OracleLength(4)) > per_round(SpeculativeDecoding(1)) + 0.05


def test_a_rows_oracle_tokens_do_not_depend_on_its_batch_mates(models) -> None:
    """Where every round drafts (no prices); with prices a row's tokens may (a row without a
    queue draws the target's token while its mates deliver theirs), never its law."""
    engine = engine_for(models, SAMPLING, Timings())
    alone = [engine.generate([p], OracleLength(4), 24, seeds=[7])[0].tokens for p in PROMPTS]
    batched = engine.generate(PROMPTS, OracleLength(4), 24, seeds=[7] * 4)
    assert [r.tokens for r in batched] == alone  # a row's tokens do not depend on its mates


def test_the_registry_knows_the_oracle_as_lossless_and_the_greedy_checks_run_it() -> None:
    methods = compose_config().methods
    traits = traits_of(methods[ORACLE], ORACLE)
    assert as_record(traits)["lossless"] and traits.needs == frozenset()
    assert ORACLE in greedy_exact(methods, {"verifier", "table", "companion"})


def speeds(**tps: float) -> dict:
    return {name: {"tokens_per_s": value} for name, value in tps.items()}


def test_each_length_policy_gets_its_share_of_the_oracles_gain() -> None:
    """target_only 10, oracle 20: sd at 15 takes half the gain, svip at 18 80 %; over sd,
    svip takes 3 of the oracle's 5; a lossy method is not a length policy."""
    methods = speeds(target_only=10.0, sd=15.0, svip=18.0, sprinter=25.0, oracle=20.0)
    lossless = {"target_only", "sd", "svip", "oracle"}
    shares = oracle_shares(methods, lossless)
    assert shares["sd"] == pytest.approx({"of_gain": 0.5, "of_gain_over_sd": 0.0})
    assert shares["svip"] == pytest.approx({"of_gain": 0.8, "of_gain_over_sd": 0.6})
    assert set(shares) == {"sd", "svip"}
    assert oracle_shares(speeds(target_only=10.0, sd=12.0), lossless) == {}
    results = {
        "methods": {n: {**row, "oracle_share": shares.get(n)} for n, row in methods.items()},
        "batches": {},
    }
    text = "\n".join(oracle_section(results))
    assert "| svip | 18.0 | 0.80 | 0.60 | – | – |\n| sd | 15.0 | 0.50 | 0.00 | – | – |" in text
    assert "sprinter" not in text
