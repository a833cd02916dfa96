"""sd_learned's stop rules (decoding/policies/plans/stop_rules.py): the round model that
chooses one against a brute-force replay of the decoder's rule, the choice's extremes, and
the decoder stopping where each rule says, its law kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sprinter_train.decoding.policies import LearnedLength, TargetOnly
from sprinter_train.decoding.policies.plans.stop_rules import (
    StopRule,
    StopRules,
    Windows,
    candidates,
    choose,
    drafts_of,
    modelled_rate,
)
from tests.decoding_helpers import (
    GREEDY,
    PROMPTS,
    RUNS,
    SAMPLING,
    VOCAB,
    chi_square_pvalue,
    engine_for,
    exact_joint,
    first_tokens,
    ragged_rows,
    tiny_trio,
)
from tests.sd_learned_helpers import linear_verifier

GAMMA = 5


def latency(rows: int, width: int) -> float:
    return 0.010 + 0.002 * rows + 0.001 * width


def step(rows: int) -> float:
    return 0.003 + 0.0005 * rows


def windows(seed: int = 0) -> Windows:
    rng = np.random.default_rng(seed)
    sequences = [(rng.uniform(0, 1, n), rng.uniform(0, 1, n)) for n in (7, 3, 12, 1)]
    return Windows.of(sequences, GAMMA)


def replay(rule: StopRule, accept: np.ndarray, score: np.ndarray, rows: int) -> int:
    """The decoder's rule, literally (LearnedLength.round's `stop`): the first draft is drawn;
    after each draw its score joins the product and, for goodput, stands in for the next's."""
    k, product, expected = 0, 1.0, 0.0
    if rule.rule == "none":
        return 0
    while k < len(score):
        a = score[k]
        k += 1
        product *= a
        expected += product
        if rule.rule == "hazard":
            stop = a < rule.threshold
        elif rule.rule == "product":
            stop = product < rule.threshold
        else:
            now = (expected + 1) / (k * step(rows) + latency(rows, k + 1))
            more = (expected + product * a + 1) / ((k + 1) * step(rows) + latency(rows, k + 2))
            stop = more <= now
        if stop:
            break
    return k


@pytest.mark.parametrize("rows", [1, 3])
def test_the_model_draws_what_the_decoders_rule_draws(rows) -> None:
    w = windows()
    for rule in candidates([0.1, 0.3, 0.6], [0.2, 0.5, 0.8]):
        drafts = drafts_of(rule, w, rows, latency, step)
        expected = [
            replay(rule, w.accept[i][w.valid[i]], w.score[i][w.valid[i]], rows)
            for i in range(len(w))
        ]
        assert drafts.tolist() == expected, rule


def test_the_modelled_rate_at_batch_1_is_the_rounds_tokens_over_their_seconds() -> None:
    w = windows(1)
    rule = StopRule("product", 0.3)
    drafts = drafts_of(rule, w, 1, latency, step)
    tokens = seconds = 0.0
    for i, d in enumerate(drafts):
        tokens += float(np.cumprod(w.accept[i][:d]).sum()) + 1.0
        seconds += d * step(1) + latency(1, d + 1)
    assert modelled_rate(drafts, w, 1, latency, step) == pytest.approx(tokens / seconds)


def test_a_round_is_as_wide_as_its_longest_row() -> None:
    """Two starts a round at batch 2: one drafting 3, one 0, cost a round of 3 drafts."""
    w = Windows(np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 3), dtype=bool))
    drafts = np.array([3, 0])
    rate = modelled_rate(drafts, w, 2, latency, step)
    assert rate == pytest.approx((4.0 + 1.0) / (3 * step(2) + latency(2, 4)))


def test_where_drafting_cannot_pay_the_choice_is_target_only_rounds() -> None:
    rules = candidates([0.2, 0.5], [0.3, 0.6])
    dear = choose(windows(), 4, latency, lambda rows: 1.0, rules)
    assert dear.rule == StopRule("none") and len(dear.rates) == len(rules)
    sure = Windows.of([(np.ones(40), np.full(40, 0.99))], GAMMA)
    cheap = choose(sure, 1, lambda rows, width: 0.01, lambda rows: 1e-5, rules)
    assert cheap.rule.rule != "none" and cheap.rates[cheap.rule.describe()] > cheap.rates["none"]


def test_a_rule_with_the_wrong_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="threshold"):
        StopRule("product")
    with pytest.raises(ValueError, match="one of"):
        StopRule("sometimes", 0.5)
    with pytest.raises(ValueError, match="stop_rule is auto"):
        LearnedLength(None, None, 4, stop_rule="sometimes")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return tiny_trio()


def half(models) -> LearnedLength:
    """sd_learned whose verifier scores every draft 1/2 (zero weights)."""
    return LearnedLength(linear_verifier(models["draft"], ["hidden", "q"], 0.0), None, 4)


@pytest.mark.parametrize(
    ("rule", "per_round"),
    [(StopRule("hazard", 0.6), 1), (StopRule("product", 0.2), 3), (StopRule("none"), 0)],
)
def test_the_decoder_stops_where_its_rule_says(models, rule, per_round) -> None:
    """Every score is 1/2: hazard < 0.6 stops after the first draft, the product falls below
    0.2 at the third, none drafts nothing (target_only's tokens, greedy)."""
    policy = half(models)
    policy.stop_rule = StopRules({1: rule})
    engine = engine_for(models, GREEDY)
    result = engine.generate([PROMPTS[0]], policy, 16)[0]
    stats = result.stats
    # every round drafts per_round a row but the last ones, which the budget's room cuts
    assert per_round * (stats.rounds - 2) <= stats.drafted <= per_round * stats.rounds
    assert (stats.draft_calls == 0) == (per_round == 0)
    assert result.tokens == engine.generate([PROMPTS[0]], TargetOnly(), 16)[0].tokens


@pytest.mark.law
def test_a_threshold_rule_keeps_the_target_law_in_ragged_batches(models) -> None:
    policy = LearnedLength(linear_verifier(models["draft"], ["token_embedding"], 150.0), None, 4)
    policy.stop_rule = StopRules({1: StopRule("product", 0.3), 3: StopRule("hazard", 0.5)})
    counts = first_tokens(engine_for(models, SAMPLING), policy, ragged_rows(RUNS))
    for prompt, observed in zip(PROMPTS, counts, strict=True):
        expected = exact_joint(models["target"], prompt, 3, SAMPLING, VOCAB)
        assert chi_square_pvalue(observed, expected) > 1e-3, prompt


def test_the_choice_is_made_again_at_the_prices_a_round_is_planned_with() -> None:
    """A rule chosen at a profile's prices gives way to target-only rounds once the prices a
    round is planned with (the run's own forwards) say drafting does not pay, on the first
    round of a batch size and every `every` rounds after."""
    sure = Windows.of([(np.ones(40), np.full(40, 0.99))], GAMMA)
    rules = tuple(candidates([0.2], [0.5]))
    cheap = (lambda rows, width: 0.01, lambda rows: 1e-5)
    dear = (latency, lambda rows: 1.0)
    chosen = StopRules({1: StopRule("goodput")}, sure, rules, every=3)
    assert chosen.at(1, *cheap).rule != "none"  # the first round chooses at its prices
    assert [chosen.at(1, *dear).rule for _ in range(2)] != ["none"] * 2  # kept between choices
    assert chosen.at(1, *dear) == StopRule("none")  # the third round after chooses again
    assert chosen.at(4) == StopRule("none")  # no prices: the last choice below stands
    # what the rounds ran by, by live rows: the re-choice shows, not the profile's choice
    assert chosen.rounds["1"]["none"] == 1 and sum(chosen.rounds["1"].values()) == 4
    assert chosen.rounds["4"] == {"none": 1}
    fixed = StopRules({1: StopRule("hazard", 0.5)})
    assert fixed.at(1, *dear) == StopRule("hazard", 0.5)  # no records: never chosen again
