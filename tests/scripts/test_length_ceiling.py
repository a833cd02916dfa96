"""benchmarks/length_ceiling.py: the round model its ceilings rest on, checked by sampling."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "length_ceiling", REPO / "benchmarks" / "length_ceiling.py"
)
ceiling = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ceiling)

COSTS = ceiling.Costs([47.5, 50.5, 50.5, 50.4, 50.8], 3.8)  # target over 1..5 tokens, a step


def sampled_goodput(chain: np.ndarray, gamma: int, draws: int, rng) -> float:
    """Tokens a millisecond of fixed-gamma rounds started at every position, each round's
    drafts accepted one by one with probability a_i until the first rejection (plus the
    target's own token), averaged over `draws` samples a round."""
    tokens = ms = 0.0
    for s in range(len(chain)):
        a = chain[s : s + gamma]
        kept = np.cumprod(rng.random((draws, len(a))) < a, axis=1).sum(1)
        tokens += kept.mean() + 1
        ms += COSTS.round_ms(len(a))
    return 1000 * tokens / ms


def test_a_rounds_expected_tokens_match_sampled_rounds() -> None:
    rng = np.random.default_rng(0)
    chain = rng.uniform(0.2, 1.0, 60)
    no_scores = np.zeros_like(chain)
    for gamma in (1, 3, 4):
        model = ceiling.goodput([(chain, chain, no_scores)], ceiling.fixed(gamma), COSTS, 4)
        sampled = sampled_goodput(chain, gamma, 4000, rng)
        assert model == pytest.approx(sampled, rel=0.01), gamma


def test_knowing_each_drafts_fate_before_the_draw_beats_every_fixed_width() -> None:
    """With acceptances of 0 or 1 known before each draw, the policy drafts the run the
    target keeps and stops at the draft it would reject: no fixed width does better."""
    rng = np.random.default_rng(1)
    fate = (rng.random(200) < 0.6).astype(float)
    chains = [(fate, fate, np.zeros_like(fate))]
    knowing = ceiling.goodput(chains, ceiling.before_the_draw(COSTS), COSTS, 4)
    for gamma in range(1, 5):
        assert knowing > ceiling.goodput(chains, ceiling.fixed(gamma), COSTS, 4)
    fates = np.array([1.0, 1.0, 0.0, 1.0])
    assert ceiling.before_the_draw(COSTS)(fates, fates, None) == 2


def test_sd_learneds_rule_stops_after_the_draft_whose_estimate_does_not_pay() -> None:
    """After the draw the estimate of x_j stands in for x_{j+1}: a sure draft is followed by
    another, a hopeless one ends the round (it was drawn, its successor is not)."""
    rule = ceiling.after_the_draw(COSTS, 0)
    assert rule(np.array([1.0, 1.0, 0.0, 1.0]), None, None) == 3
    assert rule(np.array([0.02, 1.0, 1.0]), None, None) == 1
    assert rule(np.ones(4), None, None) == 4


def test_sprinters_needed_share_gives_the_bar_at_the_benchs_own_costs() -> None:
    bench = {
        "num_prompts": 4,
        "methods": {
            "sd": {"wall_s": 40.0, "tokens": 1000},
            "sprinter": {
                "target_calls": 504,
                "draft_calls": 1200,
                "wall_s": 38.0,
                "time_breakdown_s": {"target": 30.0, "draft": 4.0, "verifier": 1.0},
                "verifier_acceptance_rate": 0.5,
                "speedup_vs_sd": 1.05,
            },
        },
    }
    need = ceiling.sprinter_needs(bench, 1.3)
    n = need["tokens_per_call_needed"]
    per_call, per_draft = (30.0 + 3.0) / 500, 5.0 / 1200  # other seconds go with the call
    assert (per_call + n * per_draft) / n == pytest.approx(40.0 / 1000 / 1.3)
    assert need["verifier_share_needed"] == pytest.approx(1 - 1 / n)


def test_a_product_threshold_stops_after_the_draft_that_takes_it_below() -> None:
    """Scored after its draw, the draft that takes the product below the floor is drafted;
    the next is not."""
    scores = np.array([0.9, 0.5, 0.9, 0.1, 0.9])  # products 0.9, 0.45, 0.405, 0.0405, ...
    assert ceiling.product_threshold(0.41)(None, None, scores) == 3
    assert ceiling.product_threshold(0.5)(None, None, scores) == 2
    assert ceiling.product_threshold(0.4)(None, None, scores) == 4
    assert ceiling.product_threshold(0.0)(None, None, scores) == 5


def bench_file(folder: Path, gamma_max: int, widths: int) -> Path:
    """A bench's results.json holding only what the ceilings read of it: gamma_max and the
    batch-1 latency profile, the target priced over 1..`widths` tokens."""
    profile = {"target_ms": {str(k): 47.5 + k for k in range(1, widths + 1)}, "draft_ms": 3.8}
    path = folder / "results.json"
    bench = {"gamma_max": gamma_max, "latency_profile": {"by_batch": {"1": profile}}}
    path.write_text(json.dumps(bench))
    return path


@pytest.mark.parametrize(
    ("gamma_max", "widths", "said"),
    [(0, 1, "gamma_max 0: its latency profile prices no round with a draft"),
     (3, 2, r"lacks the target over \['3', '4'\] tokens")],
)  # fmt: skip
def test_a_bench_that_prices_no_round_is_refused_before_the_records_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gamma_max: int, widths: int, said: str
) -> None:
    """gamma_max 0 is a valid bench (sd drafts nothing), but it leaves no length to choose and
    no fixed gamma to compare with: refused with the reason, not after minutes of loading."""

    def loading(cfg) -> None:
        raise AssertionError("the records and verifiers were loaded before the bench was read")

    monkeypatch.setattr(ceiling, "load_inputs", loading)
    path = bench_file(tmp_path, gamma_max, widths)
    monkeypatch.setattr(sys, "argv", ["length_ceiling.py", "--bench", str(path)])
    with pytest.raises(SystemExit, match=said):
        ceiling.main()
    bench, costs, gmax = ceiling.bench_costs(bench_file(tmp_path, 2, 3), "exp")
    assert gmax == 2 and costs.target == [48.5, 49.5, 50.5] and costs.draft == 3.8
