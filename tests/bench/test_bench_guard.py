"""Quality where no reference is (issue 38 item 5): the target's perplexity of a lossy
method's output against target_only's, scored in batched forwards, and the verifiers'
scores and the draft's acceptance on the bench's prompts against their training data's."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from sprinter_train.__main__ import run_stage
from sprinter_train.bench.quality.guard import (
    ScoreTally,
    domain_check,
    guard_section,
    guard_warnings,
    perplexity_bar,
    settings_of,
)
from sprinter_train.bench.quality.scores import target_perplexities, target_perplexity
from sprinter_train.bench.quality.tau_ladder import climb, hold_taus
from sprinter_train.bench.report.summary import draft_acceptance
from sprinter_train.core.config import compose_config
from sprinter_train.core.io import read_json
from sprinter_train.decoding.policies import SpeculativeDecoding, Sprinter, TargetOnly
from sprinter_train.models.tiny import TINY_DEFAULTS
from sprinter_train.stages.settings import config_problems
from tests.decoding_helpers import GREEDY, PROMPTS, SAMPLING, engine_for, tiny_trio
from tests.sd_learned_helpers import constant_accept_verifier

LOSSY = {"target_only": {"lossless": True}, "sd": {"lossless": True}, "bad": {"lossless": False}}
BARS = settings_of({})  # conf/bench's defaults
D = TINY_DEFAULTS["hidden_size"]

DEFAULT_LADDER = list(compose_config().bench.guard.tau_ladder)  # conf/bench's


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return tiny_trio()


# -- perplexity ------------------------------------------------------------------------------


def test_batched_perplexities_are_each_rows_own(models) -> None:
    """Contexts and outputs of different lengths (one output empty, one context empty) in
    batches of 1 and 3: each row's figure is its own forward's."""
    pairs = [
        (PROMPTS[0], [7, 9, 11, 40, 41]),
        (PROMPTS[1], [3]),
        ([], [5, 6, 7]),
        (PROMPTS[2], []),
        (PROMPTS[3], [60, 61, 62, 63, 64, 65, 66, 67, 68]),
    ]
    alone = [target_perplexity(models["target"], c, o) for c, o in pairs]
    for size in (1, 3, 8):
        batched = target_perplexities(models["target"], pairs, size)
        assert math.isnan(batched[3]) and math.isnan(alone[3])
        assert batched[:3] + batched[4:] == pytest.approx(alone[:3] + alone[4:], rel=1e-4)


def test_the_bar_flags_a_lossy_method_whose_output_the_target_finds_unlikely(models) -> None:
    """target_only's own greedy output against the same prompts answered with the draft's
    sampled tokens from another model: the target finds the second far less likely, and the
    bar flags it when the method is lossy, never a lossless one (sd: the same text)."""
    engine = engine_for(models, GREEDY)
    own = [r.tokens for r in engine.generate(PROMPTS, TargetOnly(), 16)]
    rng = torch.Generator().manual_seed(0)
    noise = [torch.randint(3, 128, (16,), generator=rng).tolist() for _ in PROMPTS]

    def ppl(outputs) -> float:
        values = target_perplexities(models["target"], list(zip(PROMPTS, outputs, strict=True)), 4)
        return sum(values) / len(values)

    methods = {
        "target_only": {"target_ppl": ppl(own)},
        "sd": {"target_ppl": ppl(own)},
        "bad": {"target_ppl": ppl(noise)},
    }
    bar = perplexity_bar(methods, LOSSY, BARS["ppl_ratio"])
    assert methods["bad"]["target_ppl_vs_target_only"] > 1.5
    assert methods["sd"]["target_ppl_vs_target_only"] == 1.0
    assert bar["broken"] == ["bad"] and set(bar["methods"]) == {"bad"}
    warnings = guard_warnings({"quality_guard": bar})
    assert warnings[0].startswith("**Warning:** bad's output has target perplexity")
    methods["bad"]["target_ppl"] = ppl(own) * 1.05  # within 10 %: met
    bar = perplexity_bar(methods, LOSSY, BARS["ppl_ratio"])
    assert bar["broken"] == [] and bar["methods"]["bad"]["met"] is True
    assert guard_warnings({"quality_guard": bar}) == []
    assert "bad" in "\n".join(guard_section({"quality_guard": bar}))


# -- a stricter tau ----------------------------------------------------------------------------


class Flat:
    """A verifier that scores every draft 0.8: at tau 0.5 sprinter commits the draft's text
    unchecked, above 0.8 the target checks every token (greedy: the target's own text)."""

    def __call__(self, engine, batch, rnd, step) -> torch.Tensor:
        return torch.full(step.tokens.shape, 0.8)


def test_a_lossy_method_past_the_bar_is_decoded_at_stricter_taus_until_one_holds_it(
    models,
) -> None:
    """Greedy, one prompt at a time: sprinter trusting a verifier that passes every draft
    writes the draft's text and breaks the bar; the ladder skips the tau below its own,
    tries 0.6 (still under the score: the same text, still broken), then 0.9 (every token
    checked: the target's text) and stops there, never trying 0.95."""
    engine, target = engine_for(models, GREEDY), models["target"]
    seeds, budget = [10 + i for i in range(len(PROMPTS))], 16

    def decoded(policy) -> list[list[int]]:
        return [
            engine.generate([ids], policy, budget, [seed])[0].tokens
            for ids, seed in zip(PROMPTS, seeds, strict=True)
        ]

    def ppl(outputs) -> float:
        values = target_perplexities(target, list(zip(PROMPTS, outputs, strict=True)), 4)
        return sum(values) / len(values)

    sprinter = Sprinter(Flat(), tau=0.5, max_run=4)
    methods = {
        "target_only": {"target_ppl": ppl(decoded(TargetOnly()))},
        "sprinter": {"target_ppl": ppl(decoded(sprinter))},
    }
    results = {"methods": methods}
    traits = {"target_only": {"lossless": True}, "sprinter": {"lossless": False}}
    results["quality_guard"] = perplexity_bar(methods, traits, BARS["ppl_ratio"])
    broken_ratio = methods["sprinter"]["target_ppl_vs_target_only"]
    assert results["quality_guard"]["broken"] == ["sprinter"] and broken_ratio > 1.1

    found = hold_taus(
        results, {"sprinter": sprinter}, engine, target, PROMPTS, seeds, budget,
        [0.3, 0.9, 0.6, 0.95], 4,
    )  # fmt: skip
    entry = results["quality_guard"]["tau_ladder"]["sprinter"]
    assert found == {"sprinter": entry} and sprinter.tau == 0.5  # the timed policy is untouched
    assert entry["tau"] == 0.5 and entry["stricter"] == "higher" and entry["holds"] == 0.9
    assert [t["tau"] for t in entry["tried"]] == [0.6, 0.9]
    assert entry["tried"][0]["ratio"] == pytest.approx(broken_ratio)
    assert entry["tried"][0]["met"] is False
    assert entry["tried"][1]["ratio"] == pytest.approx(1.0, rel=1e-5)
    assert entry["tried"][1]["met"] is True
    bar = results["quality_guard"]
    warning = guard_warnings({"quality_guard": bar})[0]
    assert "A stricter τ holds it: methods.sprinter.tau=0.9 (its τ 0.5" in warning
    section = "\n".join(guard_section({"quality_guard": bar}))
    assert "τ 0.6: " in section and "(1.00×, met)" in section

    # a ladder none of whose values holds it, and one with nothing stricter
    short = climb(
        sprinter, engine, target, PROMPTS, seeds, budget, bar["target_only_ppl"], 1.1, [0.6], 4
    )
    assert short["holds"] is None and len(short["tried"]) == 1
    bar["tau_ladder"]["sprinter"] = short
    assert "No τ of bench.guard.tau_ladder holds it (tried up to 0.6 from its 0.5)" in "\n".join(
        guard_warnings({"quality_guard": bar})
    )
    none = climb(sprinter, engine, target, PROMPTS, seeds, budget, 1.0, 1.1, [0.2, 0.5], 4)
    assert none["tried"] == [] and none["holds"] is None
    assert (
        climb(TargetOnly(), engine, target, PROMPTS, seeds, budget, 1.0, 1.1, [0.9], 4)["tau"]
        is None
    )


def test_a_ladder_tau_outside_zero_to_one_or_named_twice_is_refused_before_any_work() -> None:
    def problems(ladder: str) -> list[str]:
        found = config_problems(compose_config("stage=bench", f"bench.guard.tau_ladder={ladder}"))
        return [line for line in found if line.startswith("bench.guard.tau_ladder")]

    assert problems("[0.6,1.5]") == [
        "bench.guard.tau_ladder[1]=1.5 is out of range: a finite number > 0 and <= 1"
    ]
    assert problems("[0]") and problems("[-0.2]") and problems("[0.7,0.7]")
    assert problems("[0.6,0.7,0.8,0.9]") == problems("[]") == []


# -- the verifier's scores and the draft's acceptance ----------------------------------------


class Constant:
    """A verifier whose score alternates by drafted token's parity; its `prior` is read
    through the tally."""

    prior = 0.25

    def __call__(self, engine, batch, rnd, step) -> torch.Tensor:
        return (step.tokens % 2).float() * 0.5 + 0.25


class Recorded(Constant):
    def __init__(self) -> None:
        self.scores: list[float] = []

    def __call__(self, engine, batch, rnd, step) -> torch.Tensor:
        score = super().__call__(engine, batch, rnd, step)
        self.scores += score[step.active].tolist()
        return score


def test_the_tally_averages_the_scores_of_the_rows_that_drafted(models) -> None:
    recorded = Recorded()
    tally = ScoreTally(recorded)
    engine = engine_for(models, SAMPLING)
    engine.generate(PROMPTS, Sprinter(tally, tau=0.5, max_run=4), 20, seeds=[1, 2, 3, 4])
    mean, count = tally.mean()
    assert count == len(recorded.scores) > 10
    assert mean == pytest.approx(sum(recorded.scores) / count)
    assert tally.prior == 0.25 and ScoreTally(Constant()).mean() == (None, 0)


class Rounds:
    """sd as is, keeping each row's (drafted, accepted) per round."""

    def __init__(self, policy) -> None:
        self.policy, self.name, self.rounds = policy, policy.name, []

    def round(self, engine, batch):
        return self.policy.round(engine, batch)

    def update(self, row, drafted: int, accepted: int) -> None:
        self.rounds.append((drafted, accepted))


def test_the_drafts_acceptance_counts_only_the_drafts_the_target_tested(models) -> None:
    recording = Rounds(SpeculativeDecoding(3))
    results = engine_for(models, SAMPLING).generate(PROMPTS, recording, 24, seeds=[3, 4, 5, 6])
    tested = sum(a + (a < d) for d, a in recording.rounds if d)
    passed = sum(a for _, a in recording.rounds)
    assert any(a < d - 1 for d, a in recording.rounds)  # drafts past a rejection: untested
    assert draft_acceptance(results[0].stats) == pytest.approx(passed / tested)


def domain_results(prior: float, label: str, sd_acceptance: float, alpha_source: str) -> dict:
    return {
        "alpha": 0.6,
        "alpha_source": alpha_source,
        "methods": {"sd": {"draft_acceptance": sd_acceptance}},
        "settings": {
            "sprinter": {
                "verifier": {"path": "ck/verifier-x.safetensors", "label": label, "prior": prior}
            },
            "sd_online": {"verifier": {"kind": "online"}},  # no sidecar: not compared
        },
    }


def test_a_verifier_off_its_training_data_is_flagged_and_one_on_it_is_not() -> None:
    """The issue's case: a soft-label verifier whose train split accepted 0.55 of drafts
    scores 0.80 on average here, where sd's drafts pass 0.19 of their tests."""
    off = domain_check(
        domain_results(0.55, "accept_prob", 0.19, "test"), {"sprinter": (0.8, 40)}, BARS
    )
    assert off["flagged"] and off["verifiers"]["sprinter"]["flagged"]
    assert set(off["verifiers"]) == {"sprinter"}
    assert off["verifiers"]["sprinter"]["shift"] == pytest.approx(0.25)
    assert off["acceptance"]["flagged"] and off["acceptance"]["ratio"] == pytest.approx(0.19 / 0.55)
    text = "\n".join(guard_section({"domain": off}) + guard_warnings({"domain": off}))
    assert "| sprinter | verifier-x.safetensors | 0.800 | 0.550 | +0.250 | **yes** |" in text
    assert "0.190 against 0.550" in text and "**unlike the training data**" in text
    assert "**Warning:** a verifier runs on prompts unlike its training data" in text
    on = domain_check(
        domain_results(0.55, "accept_prob", 0.5, "test"), {"sprinter": (0.6, 40)}, BARS
    )
    assert not on["flagged"] and guard_warnings({"domain": on}) == []
    # a ratio verifier's mean label is not an acceptance: the records' beta is the reference
    ratio = domain_check(
        domain_results(0.3, "ratio", 0.5, "records (900 rows)"), {"sprinter": (0.3, 40)}, BARS
    )
    assert ratio["acceptance"]["reference"] == 0.6 and not ratio["flagged"]
    unknown = domain_check(domain_results(0.3, "ratio", 0.1, "sd on the warm-up prompt"), {}, BARS)
    assert unknown["acceptance"]["reference"] is None and not unknown["flagged"]
    assert domain_check({"methods": {}, "settings": {"sd": {"gamma": 3}}}, {}, BARS) == {}
    # a train split that accepted nothing has no ratio to report: said, not a crash
    nothing = domain_check(domain_results(0.0, "accept_prob", 0.19, "test"), {}, BARS)
    assert nothing["acceptance"]["reference"] == 0.0 and nothing["acceptance"]["ratio"] is None
    assert "0.190 against 0.000" in "\n".join(guard_section({"domain": nothing}))


# -- the whole stage -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> dict:
    """stage=bench on tiny models, sampled, batch 1: sprinter and sd_learned read a soft-label
    verifier that scores every draft 0.8 where its train split's mean label was 0.3, so
    sprinter commits the draft's text unchecked; the oracle beside them."""
    root = tmp_path_factory.mktemp("guard")
    cfg = compose_config(
        f"artifacts_root={root}",
        "device=cpu",
        "dtype=float32",
        "num_threads=1",
        f"checkpoints_root={root / 'checkpoints'}",
        "stage=bench",
        "models=tiny_random",
        "experiment=guard",
        "data.max_prompt_tokens=48",
        "bench.num_prompts=4",
        "bench.max_new_tokens=12",
        "bench.batch_sizes=[]",
        "bench.gamma_max=3",
        "bench.latency.reps=1",
        "bench.judge.enabled=false",
        "bench.energy=false",
        "bench.law_distance_prompts=0",
        "bench.methods=[target_only,sd,oracle,sd_learned,sprinter]",
        "methods.sd_learned.table=null",
        "++methods.sprinter.verifier.label=accept_prob",
        "methods.sd.gamma=2",
    )
    constant_accept_verifier(cfg.checkpoint_dir, 0.3)  # scores 0.8
    run_stage(cfg)
    out = Path(cfg.experiment_dir) / "bench"
    return {"results": read_json(out / "results.json"), "md": (out / "results.md").read_text()}


@pytest.mark.heavy  # a whole bench stage
def test_the_bench_guards_quality_and_the_verifiers_domain_and_shows_the_oracle(bench) -> None:
    results, md = bench["results"], bench["md"]
    methods = results["methods"]
    guard = results["quality_guard"]
    assert set(guard["methods"]) == {"sprinter"}  # the one lossy method
    assert guard["target_only_ppl"] == methods["target_only"]["target_ppl"]
    assert guard["methods"]["sprinter"]["ratio"] == pytest.approx(
        methods["sprinter"]["target_ppl"] / methods["target_only"]["target_ppl"]
    )
    assert guard["methods"]["sprinter"]["met"] == (guard["methods"]["sprinter"]["ratio"] <= 1.1)
    assert set(guard["tau_ladder"]) == set(guard["broken"])  # decoded again only when broken
    for entry in guard["tau_ladder"].values():  # conf/bench's ladder, nearest first, up to a hold
        tried = [t["tau"] for t in entry["tried"]]
        ladder = [t for t in DEFAULT_LADDER if t > entry["tau"]]
        assert tried == ladder[: len(tried)] and entry["holds"] in (None, tried[-1])
    assert "## Quality without a reference" in md
    domain = results["domain"]
    for name in ("sprinter", "sd_learned"):  # sd_learned drafts only where the profile pays
        entry = domain["verifiers"][name]
        assert entry["train_mean_label"] == pytest.approx(0.3)
        assert entry["flagged"] == (entry["scored"] > 0)
        assert entry["scored"] == 0 or entry["mean_score"] == pytest.approx(0.8)
    assert domain["verifiers"]["sprinter"]["scored"] > 0
    assert domain["flagged"] and "a verifier runs on prompts unlike its training data" in md
    assert domain["acceptance"]["by"] == "sd"
    assert domain["acceptance"]["reference"] == pytest.approx(0.3)
    share = methods["sd"]["oracle_share"]
    assert share["of_gain_over_sd"] == 0.0
    assert "## Against the oracle length" in md and methods["oracle"]["tokens_per_s"] > 0
    assert methods["oracle"]["draft_runs"]["oracle_gap"] in (None, 1.0)
