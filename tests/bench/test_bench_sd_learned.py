"""The bench's account of sd_learned (issue 13): the verifier's prior from its sidecar, the
first-token law distance, the bar against its best rival, and the numbers that say
why it falls short (predictor cost, calibration, chosen against oracle draft lengths)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from sprinter_train.__main__ import run_stage
from sprinter_train.bench.quality.law_distance import first_token_tv
from sprinter_train.bench.report.results_md import write_results
from sprinter_train.bench.report.summary import costs_ms, draft_runs
from sprinter_train.bench.report.verdicts import VS_BEST, best_rival, check_targets, vs_best
from sprinter_train.core.config import compose_config
from sprinter_train.core.io import read_json
from sprinter_train.decoding.batch import Batch, DecodeStats, Emitted, Row
from sprinter_train.decoding.builder import build_engine, build_runner
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import LearnedLength, SpeculativeDecoding, TargetOnly
from sprinter_train.decoding.policies.registry import as_record
from sprinter_train.harvest.reader import open_records
from sprinter_train.models.tiny import TINY_DEFAULTS
from sprinter_train.verifier.checkpoint import load_verifier, save_verifier, verifier_path
from sprinter_train.verifier.data import split_features
from sprinter_train.verifier.labels import Label
from sprinter_train.verifier.scorer import CheckpointVerifier
from sprinter_train.verifier.split_metrics import class_balance
from tests.decoding_helpers import (
    GREEDY,
    PACK_EVERY,
    PROMPTS,
    SAMPLING,
    VOCAB,
    ATable,
    engine_for,
    fixed_timings,
    latency,
    tiny_trio,
)
from tests.sd_learned_helpers import after_draw, before_draw
from tests.synthetic import SYNTHETIC_FEATURES, write_synthetic_records


def drafts_first(engine: Engine, policy: LearnedLength, prompt: list[int]) -> bool:
    """Whether sd_learned draws a first draft after `prompt` (its first-draft rule)."""
    q = torch.zeros(VOCAB)
    return bool(policy.first_draft_keeps(engine, prompt, q, None).all())


RIVALS = LearnedLength.traits.rivals
LEARNED_BAR = "sd_learned" + VS_BEST  # the bar its traits give it (a learned length)
TRAITS = {"sd_learned": as_record(LearnedLength.traits)}  # what results.json records of it
D = TINY_DEFAULTS["hidden_size"]  # the tiny draft's hidden width: its verifier reads it


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return tiny_trio()


# -- the verifier's prior --------------------------------------------------------------------


def test_the_prior_is_the_train_splits_mean_label_and_skips_rounds_it_would_not_pay(
    compose_cfg, tmp_path, models
) -> None:
    """A soft-label verifier trained by stage=train: its prior is the train split's mean
    min(1, p/q), which its calibrated scores average to on those rows; with a drafting step
    that only a sure draft would pay for, sd_learned drafts nothing with that prior, and
    drafts without it."""
    cfg = compose_cfg(
        "stage=train",
        "experiment=syn",
        f"checkpoints_root={tmp_path / 'checkpoints'}",
        "train.batch_size=512",
        "train.learning_curve=[]",
        "train.label=accept_prob",
        SYNTHETIC_FEATURES,
    )
    write_synthetic_records(cfg.experiment_dir, rows=4096, d=D, shard_rows=2048, noise=0.3)
    run_stage(cfg)
    checkpoint = load_verifier(verifier_path(cfg.checkpoint_dir, Label("accept_prob")))
    verifier = CheckpointVerifier(checkpoint, models["draft"])
    records = open_records(cfg.experiment_dir)
    features, rows = split_features(records, "train", checkpoint.spec)
    accept = records.frame["accept_prob"].to_numpy()[rows]
    assert verifier.prior == pytest.approx(float(accept.mean()), abs=1e-6)
    assert 0.1 < verifier.prior < 0.9
    calibrated = checkpoint.calibrated_score(features.batch())
    assert abs(float(calibrated.mean()) - verifier.prior) < 0.02  # calibrated: on average right

    # goodput of no draft 1 / 1.1; of one draft at acceptance a, (1 + a) / (step + 1.2)
    low = 1.1 * (1 + verifier.prior) - 1.2
    step = (low + 1.0) / 2  # pays at a = 1, not at the prior
    policy = LearnedLength(verifier, None, max_gamma=4)
    engine = engine_for(models, GREEDY, fixed_timings(latency, lambda b: step))
    assert not policy.worth_a_draft(engine.timings, 1)
    assert engine.generate(PROMPTS, policy, 8)[0].stats.draft_calls == 0
    verifier.prior = None  # as an old sidecar leaves it
    assert policy.worth_a_draft(engine.timings, 1)
    assert engine.generate(PROMPTS, policy, 8)[0].stats.draft_calls > 0


def test_a_ratio_verifiers_prior_is_its_labels_share_and_old_sidecars_have_none(
    tmp_path, models
) -> None:
    write_synthetic_records(tmp_path / "syn", rows=2048, d=D, shard_rows=1024)
    records = open_records(tmp_path / "syn")
    meta = {"lam": 1.2, "label": "ratio", "features": {"names": ["hidden"]}}
    balance = {"class_balance": class_balance(records, Label("ratio", 1.2))}
    path = save_verifier(verifier_path(tmp_path, 1.2), torch.zeros(D), torch.zeros(1), meta)
    old = CheckpointVerifier(load_verifier(path), models["draft"])
    assert old.prior is None
    save_verifier(path, torch.zeros(D), torch.zeros(1), {**meta, **balance})
    ratio = records.frame["ratio"].to_numpy()[records.rows_of("train")]
    verifier = CheckpointVerifier(load_verifier(path), models["draft"])
    assert verifier.prior == pytest.approx(float((ratio <= 1.2).mean()))


# -- the first-token law ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", [before_draw, after_draw], ids=lambda k: k.__name__)
def test_sd_learned_is_at_distance_zero_whether_it_drafts_or_not(models, kind) -> None:
    engine = engine_for(models, SAMPLING)
    policy = kind(models)
    for prompt in PROMPTS:  # the probe decides as a real run of the policy does
        alone = engine.generate([prompt], policy, 2)[0].stats
        assert drafts_first(engine, policy, prompt) == (alone.drafted > 0)
    tv = first_token_tv(engine, policy, PROMPTS)
    assert len(tv) == len(PROMPTS) and max(tv) < 1e-6
    assert any(drafts_first(engine, policy, prompt) for prompt in PROMPTS)
    dear = LearnedLength(policy.verifier, ATable(), max_gamma=4)
    engine.timings = fixed_timings(latency, lambda b: 10.0)
    assert not any(drafts_first(engine, dear, prompt) for prompt in PROMPTS)
    assert max(first_token_tv(engine, dear, PROMPTS)) < 1e-6


# -- per-round draft runs against the oracle -------------------------------------------------


class Recording:
    """A policy as is, keeping each row's (drafted, accepted) of every round as the engine
    hands them to `update`."""

    def __init__(self, policy) -> None:
        self.policy, self.name = policy, policy.name
        self.rounds: list[tuple[int, int]] = []

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        return self.policy.round(engine, batch)

    def update(self, row: Row, drafted: int, accepted: int) -> None:
        self.rounds.append((drafted, accepted))


def by_hand(rounds: list[tuple[int, int]]) -> dict[str, float | None]:
    drafting = [(d, a) for d, a in rounds if d > 0]
    rejected = [d - a for d, a in drafting if a < d]
    return {
        "row_rounds": len(rounds),
        "drafted_per_round": sum(d for d, _ in rounds) / len(rounds),
        "accepted_per_round": sum(a for _, a in rounds) / len(rounds),
        "no_draft_share": 1 - len(drafting) / len(rounds),
        "all_accepted_share": sum(a == d for d, a in drafting) / len(drafting)
        if drafting
        else None,
        "oracle_gap": sum(rejected) / len(rejected) if rejected else None,
    }


@pytest.mark.parametrize("which", ["sd_learned", "sd"])
def test_the_stats_count_each_rows_rounds_against_the_oracle(models, which) -> None:
    policy = before_draw(models) if which == "sd_learned" else SpeculativeDecoding(3)
    recording = Recording(policy)
    results = engine_for(models, SAMPLING).generate(PROMPTS, recording, 24, seeds=[3, 4, 5, 6])
    stats = results[0].stats
    drafted = [d for d, _ in recording.rounds]
    assert sum(drafted) == stats.drafted and stats.row_rounds == len(recording.rounds)
    assert stats.row_rounds > stats.rounds  # four rows a round at first
    figures = draft_runs(stats)
    expected = by_hand(recording.rounds)
    assert figures == pytest.approx(expected)
    assert expected["oracle_gap"] is not None and expected["all_accepted_share"] is not None
    assert 0 < expected["all_accepted_share"] < 1  # both kinds of rounds: both figures tested


def test_a_draft_the_target_always_keeps_leaves_no_oracle_gap(models) -> None:
    target = models["target"]
    engine = build_engine(
        build_runner(target, VOCAB),
        GREEDY,
        VOCAB,
        draft=build_runner(target, VOCAB),
        pack_every=PACK_EVERY,
    )
    stats = engine.generate(PROMPTS, SpeculativeDecoding(3), 16)[0].stats
    figures = draft_runs(stats)
    assert figures["all_accepted_share"] == 1.0 and figures["oracle_gap"] is None
    assert figures["accepted_per_round"] == figures["drafted_per_round"] > 2
    target_only = engine.generate(PROMPTS, TargetOnly(), 16)
    tallies = draft_runs(target_only[0].stats)
    assert tallies["row_rounds"] == sum(len(r.tokens) for r in target_only)  # one token a round
    assert tallies["no_draft_share"] == 1.0 and tallies["all_accepted_share"] is None


def test_costs_per_drafted_token_and_methods_without_rounds() -> None:
    stats = DecodeStats(
        drafted=10, draft_calls=6, verifier_calls=6, draft_seconds=0.3, verifier_seconds=0.02
    )
    stats.target_calls, stats.target_seconds, stats.target_prefill_seconds = 4, 0.5, 0.1
    assert costs_ms(stats) == pytest.approx(
        {
            "verifier_per_draft": 2.0,
            "companion_per_draft": None,
            "draft_per_draft": 30.0,
            "draft_step": 50.0,
            "target_call": 100.0,  # the prefill's 0.1 s is not a call's
        }
    )
    peer = DecodeStats(target_calls=5, draft_calls=9)  # HF's: calls, no seconds, no rounds
    assert set(costs_ms(peer).values()) == {None} and set(draft_runs(peer).values()) == {None}
    trusting = DecodeStats(row_rounds=3, drafted=6, verifier_accepted=5, verifier_calls=6)
    assert set(draft_runs(trusting).values()) == {None}  # sprinter: no target-checked length


# -- the bar and the report ------------------------------------------------------------------


def method(tokens_per_s: float, wall_s: float = 2.0, verifier_s: float = 0.0) -> dict:
    return {
        "tokens": tokens_per_s * wall_s,
        "tokens_per_s": tokens_per_s,
        "wall_s": wall_s,
        "target_calls": 5,
        "draft_calls": 9,
        "tokens_per_target_call": 2.0,
        "acceptance_rate": 0.5,
        "verifier_acceptance_rate": None,
        "time_breakdown_s": {"target": 1.0, "draft": 0.5, "companion": 0.0, "verifier": verifier_s},
    }


def learned(tokens_per_s: float, verifier_s: float) -> dict:
    row = method(tokens_per_s, verifier_s=verifier_s)
    row["cost_ms"] = {
        "verifier_per_draft": 0.125,
        "companion_per_draft": None,
        "draft_per_draft": 0.5,
        "draft_step": 1.5,
    }
    row["draft_runs"] = {
        "row_rounds": 40,
        "drafted_per_round": 2.25,
        "accepted_per_round": 1.5,
        "no_draft_share": 0.1,
        "all_accepted_share": 0.4,
        "oracle_gap": 1.75,
    }
    return row


def results_with(batch_one: dict, batch_four: dict) -> dict:
    return {
        "experiment": "exp",
        "num_prompts": 4,
        "max_new_tokens": 8,
        "sampling": {"temperature": 0},
        "device": "cpu",
        "dtype": "float32",
        "threads": 1,
        "models": {},
        "sd_gamma": 3,
        "alpha": 0.5,
        "alpha_source": "test",
        "latency_profile": {"target_ms": {"1": 30.0}, "draft_ms": 3.0, "companion_ms": None},
        "traits": TRAITS,
        "methods": batch_one,
        "batches": {
            "1": {"methods": batch_one, "sd_gamma": 3, "groups": 4, "unsupported": {}},
            "4": {"methods": batch_four, "sd_gamma": 2, "groups": 1, "unsupported": {}},
        },
        "settings": {
            "sd_learned": {
                "verifier": {
                    "label": "accept_prob",
                    "path": "ck/verifier-accept.safetensors",
                    "calibration": {
                        "method": "temperature",
                        "temperature": 1.75,
                        "fitted_on": "val",
                        "rows": 512,
                        "nll_before": 0.6123,
                        "nll_after": 0.5871,
                    },
                    "prior": 0.625,
                },
                "table": {"binning": None, "path": None},
            }
        },
    }


def test_the_bar_is_over_the_fastest_of_sd_learneds_rivals() -> None:
    assert set(RIVALS) == {"sd", "svip", "sd_heuristic"}
    methods = {
        "sd": method(10.0),
        "svip": method(11.0),
        "sd_heuristic": method(9.0),
        "sv": method(30.0),  # not one of the three: not the bar's reference
        "sd_learned": method(12.0),
    }
    assert best_rival(methods, RIVALS) == "svip"
    assert vs_best(methods, "sd_learned", RIVALS) == pytest.approx(12 / 11)
    (row,) = check_targets({"methods": methods, "traits": TRAITS}, {LEARNED_BAR: 1.05})
    assert row == {
        "name": LEARNED_BAR,
        "measured": pytest.approx(12 / 11),
        "bar": 1.05,
        "met": True,
        "against": "svip",
    }
    methods["sd_learned"] = method(11.0)
    assert (
        check_targets({"methods": methods, "traits": TRAITS}, {LEARNED_BAR: 1.05})[0]["met"]
        is False
    )
    del methods["svip"]
    assert best_rival(methods, RIVALS) == "sd"
    assert vs_best(methods, "sd_learned", RIVALS) == pytest.approx(1.1)
    only_sd = {"methods": {"sd": method(10.0)}, "traits": TRAITS}
    assert check_targets(only_sd, {LEARNED_BAR: 1.05}) == []


def test_results_md_says_per_batch_size_why_sd_learned_falls_short(tmp_path: Path) -> None:
    one = {"sd": method(10.0), "svip": method(11.0), "sd_learned": learned(12.0, 0.2)}
    four = {"sd": method(40.0), "sd_heuristic": method(42.0), "sd_learned": learned(36.0, 0.4)}
    results = results_with(one, four)
    results["targets"] = check_targets(results, {LEARNED_BAR: 1.05})
    write_results(tmp_path, results)
    lines = (tmp_path / "results.md").read_text().splitlines()
    assert f"- {LEARNED_BAR}: 1.09 (bar >= 1.05, over svip): met" in lines
    start = lines.index("## sd_learned against its best rival")
    section = lines[start:]
    header = next(line for line in section if line.startswith("| batch |"))
    assert "| × best, predictor free | verifier ms / draft |" in header
    assert header.endswith("| all-accepted rounds | chosen − oracle |")
    row_one = next(line for line in section if line.startswith("| 1 |"))
    row_four = next(line for line in section if line.startswith("| 4 |"))
    # batch 1 meets the bar; batch 4 is short (36 / 42), in bold, and would still be short
    # without its predictor's 0.4 s: 72 tokens / 1.6 s = 45 tokens/s, 1.07 x 42
    assert row_one.startswith("| 1 | 12.0 | svip 11.0 | 1.09 | 1.21 | 0.125 | – | 0.500 |")
    assert row_four.startswith("| 4 | 36.0 | sd_heuristic 42.0 | **0.86** | 1.07 |")
    assert row_four.endswith("| 0.125 | – | 0.500 | 1.500 | 2.25 | 1.50 | 0.10 | 0.40 | 1.75 |")
    verifier = next(line for line in section if line.startswith("Its verifier"))
    assert "temperature 1.750 fitted on val (512 rows), NLL 0.6123 before, 0.5871 after" in verifier
    assert "prior 0.625" in verifier and "SV table: none" in verifier
    assert header.count("|") == row_four.count("|") == row_one.count("|")


def test_results_md_has_no_sd_learned_section_when_it_did_not_run(tmp_path: Path) -> None:
    results = results_with({"sd": method(10.0)}, {"sd": method(30.0)})
    write_results(tmp_path, results)
    assert "sd_learned" not in (tmp_path / "results.md").read_text()


# -- the whole stage -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> dict:
    """stage=bench on tiny models, greedy, at batch 1 and 4, sd_learned with a verifier of
    the bench's draft exported as stage=train exports one (calibration and class balance in
    its sidecar; a constant score, so its decisions rest on the goodput arithmetic)."""
    root = tmp_path_factory.mktemp("sd_learned")
    overrides = (f"artifacts_root={root}", "device=cpu", "dtype=float32", "num_threads=1")
    cfg = compose_config(
        *overrides,
        f"checkpoints_root={root / 'checkpoints'}",
        "stage=bench",
        "models=tiny_random",
        "experiment=learned",
        "sampling.temperature=0",
        "data.max_prompt_tokens=48",
        "bench.num_prompts=5",
        "bench.max_new_tokens=8",
        "bench.batch_sizes=[4]",
        "bench.gamma_max=3",
        "bench.latency.reps=1",
        "bench.judge.enabled=false",
        "bench.energy=false",
        "bench.law_distance_prompts=3",
        "bench.methods=[target_only,sd,sd_heuristic,svip,sd_learned]",
        "methods.sd_learned.table=null",  # the verifier alone: no SV table to fit first
        "methods.sd.gamma=2",  # drafts whatever the profile of this machine says
    )
    path = verifier_path(cfg.checkpoint_dir, Label("accept_prob"))
    path.parent.mkdir(parents=True)
    calibration = {
        "method": "temperature",
        "temperature": 2.0,
        "fitted_on": "val",
        "rows": 300,
        "nll_before": 0.65,
        "nll_after": 0.6,
    }
    meta = {
        "lam": None,
        "label": "accept_prob",
        "calibration": calibration,
        "class_balance": {"train": {"rows": 900, "mean_accept_prob": 0.7}},
        "features": {"names": ["hidden"], "d_in": D},
    }
    save_verifier(path, torch.zeros(D), torch.tensor([2 * math.log(4)]), meta)  # scores 0.8
    run_stage(cfg)
    out = Path(cfg.experiment_dir) / "bench"
    return {"results": read_json(out / "results.json"), "out": out, "path": str(path)}


@pytest.mark.heavy  # a whole bench stage (the module's fixture)
def test_the_bench_reports_sd_learneds_law_bar_and_draft_runs(bench) -> None:
    results = bench["results"]
    methods = results["methods"]
    learned_row = methods["sd_learned"]
    assert len(learned_row["tv_first_token_per_prompt"]) == 3
    assert learned_row["tv_first_token"] == pytest.approx(0.0, abs=1e-6)
    assert learned_row["outputs_differing_from_target_only"] == 0  # float32 greedy: lossless
    (bar,) = [t for t in results["targets"] if t["name"] == LEARNED_BAR]
    assert bar["bar"] == 1.05 and bar["against"] in ("sd", "svip", "sd_heuristic")
    assert bar["measured"] == pytest.approx(
        learned_row["tokens_per_s"] / methods[bar["against"]]["tokens_per_s"]
    )
    assert bar["met"] == (bar["measured"] >= 1.05)
    verifier = results["settings"]["sd_learned"]["verifier"]
    assert verifier["prior"] == 0.7 and verifier["calibration"]["temperature"] == 2.0
    for size in ("1", "4"):
        row = results["batches"][size]["methods"]["sd_learned"]
        runs, tokens = row["draft_runs"], row["tokens"]
        # every round of a row emits its kept drafts and one token of the target's
        emitted = runs["row_rounds"] * (runs["accepted_per_round"] + 1)
        assert emitted >= tokens and runs["row_rounds"] <= tokens
        sd = results["batches"][size]["methods"]["sd"]["draft_runs"]
        assert sd["no_draft_share"] < 0.5 and 1 <= sd["drafted_per_round"] <= 2


@pytest.mark.heavy  # a whole bench stage (the module's fixture)
def test_the_benchs_results_md_shows_the_sd_learned_section(bench) -> None:
    text = (bench["out"] / "results.md").read_text()
    section = text[text.index("## sd_learned against its best rival") :]
    assert "| 1 |" in section and "| 4 |" in section
    assert f"Its verifier `{bench['path']}` (label accept_prob): temperature 2.000" in section
    assert "prior 0.700" in section
    assert f"- {LEARNED_BAR}: " in text and "TV 1st token" in text


def test_a_new_method_with_sd_learneds_traits_gets_its_section_and_bar(tmp_path: Path) -> None:
    """The report picks its sections and bars from the traits: another learned length (a
    lossless method reading a trained verifier, with rivals) gets sd_learned's section and
    `<name>_vs_best_lossless` bar without a line of report.py naming it."""
    one = {"sd": method(10.0), "svip": method(11.0), "mine": learned(12.0, 0.2)}
    four = {"sd": method(40.0), "sd_heuristic": method(42.0), "mine": learned(36.0, 0.4)}
    results = results_with(one, four)
    results["traits"] = {"mine": as_record(LearnedLength.traits)}
    results["settings"] = {"mine": results["settings"]["sd_learned"]}
    results["targets"] = check_targets(results, {"mine" + VS_BEST: 1.05})
    assert results["targets"][0]["against"] == "svip"
    write_results(tmp_path, results)
    lines = (tmp_path / "results.md").read_text().splitlines()
    start = lines.index("## mine against its best rival")
    assert any(line.startswith("| 1 | 12.0 | svip 11.0 | 1.09 |") for line in lines[start:])
    assert "sd_learned" not in "\n".join(lines)
