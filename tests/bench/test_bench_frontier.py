"""The lossy frontier (bench/quality/frontier.py): each lossy rule's tokens/s against the
target's perplexity ratio to target_only, which points are on the frontier, the verifier's
fastest point within the bar against the best hand rule's, results.md's section and plot, and
a whole bench stage on tiny models writing them."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from sprinter_train.__main__ import run_stage
from sprinter_train.bench.quality.frontier import (
    KEYS,
    RULES,
    fastest_within,
    on_frontier,
    pareto,
    settings,
    verdict,
    wanted,
)
from sprinter_train.bench.report.frontier_lines import frontier_section
from sprinter_train.bench.report.plots import plot_frontier
from sprinter_train.bench.run.methods import plan_methods, verifier_hidden_layer
from sprinter_train.core.config import compose_config
from sprinter_train.core.io import read_json
from sprinter_train.decoding.policies.entropy_verifier import EntropyVerifier
from sprinter_train.models.tiny import TINY_DEFAULTS, build_tiny_model
from sprinter_train.stages.settings import config_problems
from tests.sd_learned_helpers import constant_accept_verifier

D = TINY_DEFAULTS["hidden_size"]


def entry(rule: str, threshold: float, speed: float | None, ratio: float | None) -> dict:
    method = "typical" if rule == "typical" else "sprinter"
    values = (method, rule, threshold, 1, speed, ratio)
    return dict(zip(KEYS, values, strict=True))


# -- the pure part ---------------------------------------------------------------------------


def test_the_frontier_keeps_the_points_no_other_beats_on_both_speed_and_ratio() -> None:
    """(tokens/s, ppl ratio): faster is better, a lower ratio is better; a point at least as
    fast with at most the ratio, better in one, knocks another off; equal points both stay; a
    point missing a figure is neither on it nor beats any."""
    points = [
        (100.0, 1.00),  # the slowest, the best ratio: on
        (150.0, 1.05),  # on
        (140.0, 1.06),  # beaten by (150, 1.05)
        (200.0, 1.30),  # the fastest: on
        (150.0, 1.05),  # equal to the second: both stay
        (150.0, 1.07),  # as fast as the second, a worse ratio: off
        (None, 0.90),  # not timed: off, and it knocks nothing off
        (300.0, None),  # no ratio: off
        (90.0, 1.00),  # as good a ratio as the first, slower: off
    ]
    assert pareto(points) == [True, True, False, True, True, False, False, False, False]
    assert pareto([]) == []
    assert pareto([(1.0, float("nan"))]) == [False]
    brute = [
        all(
            not (s2 >= s and r2 <= r and (s2 > s or r2 < r))
            for s2, r2 in points
            if s2 is not None and r2 is not None
        )
        for s, r in points
        if s is not None and r is not None
    ]
    assert [on for on, (s, r) in zip(pareto(points), points, strict=True) if s and r] == brute


def test_the_fastest_point_within_the_bar() -> None:
    points = [(100.0, 1.00), (150.0, 1.10), (200.0, 1.11), (None, 1.0), (120.0, None)]
    assert fastest_within(points, 1.1) == 1  # the bar itself holds
    assert fastest_within(points, 1.05) == 0
    assert fastest_within(points, 0.5) is None


def test_the_verdict_sets_the_verifier_against_the_best_hand_rule_either_way() -> None:
    entries = [
        entry("verifier", 0.5, 130.0, 1.08),
        entry("verifier", 0.3, 180.0, 1.40),  # faster but past the bar
        entry("entropy", 0.5, 100.0, 1.02),
        entry("typical", 0.1, 120.0, 1.09),
        entry("typical", 0.03, None, 1.04),  # not timed: not a candidate
    ]
    reading = verdict(entries, 1.1, 1.05)
    assert reading["best_hand"] == "typical"
    assert reading["fastest"]["verifier"]["tokens_per_s"] == 130.0
    assert reading["verifier_vs_hand"] == pytest.approx(130 / 120) and reading["met"] is True
    entries[0]["tokens_per_s"] = 121.0  # 121 / 120 < 1.05: not met, and said so
    reading = verdict(entries, 1.1, 1.05)
    assert reading["met"] is False
    text = "\n".join(
        frontier_section(
            {
                "frontier": entries,
                "frontier_summary": summary_for(entries, {"1": reading}),
            }
        )
    )
    assert "## Lossy frontier" in text and "| entropy | τ 0.5 | 1.020 | 100.0 | **yes** |" in text
    assert "| typical | ε 0.1 | 1.090 | 120.0 | no |" in text  # (121, 1.08) beats it
    assert "1.01× the best hand rule's (typical, ε 0.1, 120.0 tokens/s at ratio 1.090)" in text
    assert "**NOT met**" in text and "does not buy that much speed" in text
    # no verifier point within the bar: no ratio, said so, and the hand rule's point named
    alone = [e for e in entries if e["rule"] != "verifier"] + [entry("verifier", 0.9, 90.0, 1.5)]
    reading = verdict(alone, 1.1, 1.05)
    assert reading["verifier_vs_hand"] is None and reading["met"] is None
    text = "\n".join(
        frontier_section(
            {"frontier": alone, "frontier_summary": summary_for(alone, {"1": reading})}
        )
    )
    assert "the verifier rule has no timed point within the bar, while typical has one" in text
    assert "verifier: no timed point within the bar, its least ratio 1.500" in text


def summary_for(entries: list[dict], verdicts: dict, absent: dict | None = None) -> dict:
    return {
        "bar": 1.1,
        "target_only_ppl": 10.0,
        "target_only_ppl_from": "target_only's timed batch-1 run",
        "batches": [1],
        "batches_not_run": [],
        "ladders": {rule: [] for rule in RULES},
        "verifier": None,
        "absent": absent or {},
        "timing": {"warmup_runs": 1, "min_timed_runs": 4},
        "untimed_tokens_per_s": [50.0] * len(entries),
        "verdicts": verdicts,
    }


def test_on_frontier_reads_only_timed_points_and_the_plot_is_written(tmp_path) -> None:
    entries = [
        entry("verifier", 0.5, 130.0, 1.08),
        entry("entropy", 0.5, None, 1.02),
        entry("typical", 0.1, 120.0, 1.01),
    ]
    assert on_frontier(entries) == [True, False, True]
    results = {
        "frontier": entries,
        "frontier_summary": summary_for(entries, {"1": verdict(entries, 1.1, 1.05)}),
        "experiment": "x",
        "device": "cpu",
    }
    path = plot_frontier(results, tmp_path / "frontier.png")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_frontier({"methods": {}}, tmp_path / "none.png") is None
    assert frontier_section({"methods": {}}) == []


def test_it_runs_whenever_a_lossy_method_is_benched_unless_switched_off(bench_cfg) -> None:
    assert settings(bench_cfg.bench.frontier)["enabled"] == "auto"
    assert settings({})["verifier"] == [float(v) for v in bench_cfg.bench.frontier.verifier]
    lossless = SimpleNamespace(plan=SimpleNamespace(policies={"target_only": 0, "sd": 0}))
    lossy = SimpleNamespace(plan=SimpleNamespace(policies={"sd": 0, "mtad": 0}))
    assert not wanted(bench_cfg, lossless) and wanted(bench_cfg, lossy)
    assert not wanted(with_setting(bench_cfg, "bench.frontier.enabled", "no"), lossy)
    assert wanted(with_setting(bench_cfg, "bench.frontier.enabled", True), lossless)


def test_its_settings_are_checked_before_any_model_loads(bench_cfg) -> None:
    def problems(key: str, value) -> list[str]:
        found = config_problems(with_setting(bench_cfg, key, value))
        return [line for line in found if line.startswith("bench.frontier")]

    assert problems("bench.frontier.verifier", []) == []  # the rule left out
    assert problems("bench.frontier.typical", [0.1, 1.5])[0].startswith("bench.frontier.typical[1]")
    assert problems("bench.frontier.entropy", [0])
    assert problems("bench.frontier.enabled", "sometimes")
    assert problems("bench.frontier.batches", [0])


def test_sprinter_takes_the_entropy_rule_as_its_verifier_from_its_config(bench_cfg) -> None:
    """`verifier: {kind: entropy}`: the bench builds the hand rule, loads no checkpoint (none
    exists here) and reads no draft hidden layer for it, and records what it ran."""
    cfg = with_setting(bench_cfg, "bench.methods", ["sprinter"])
    cfg = with_setting(cfg, "methods.sprinter.verifier", {"kind": "entropy"})
    assert config_problems(cfg) == []
    assert verifier_hidden_layer(cfg) == -1
    plan = plan_methods(cfg, 3, build_tiny_model({}, seed=0), False)
    assert plan.skipped == {}
    assert isinstance(plan.policies["sprinter"].verifier, EntropyVerifier)
    assert plan.settings["sprinter"]["verifier"]["kind"] == "entropy"


@pytest.fixture(scope="module")
def bench_cfg():
    return compose_config("stage=bench")


def with_setting(cfg, key: str, value):
    changed = copy.deepcopy(cfg)
    OmegaConf.update(changed, key, value, merge=False)
    return changed


# -- the whole stage -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> dict:
    """stage=bench on tiny models, sampled, batch 1: sprinter reads a soft-label verifier that
    scores every draft 0.8; the frontier traces the three rules over two thresholds each."""
    root = tmp_path_factory.mktemp("frontier")
    cfg = compose_config(
        f"artifacts_root={root}",
        "device=cpu",
        "dtype=float32",
        "num_threads=1",
        f"checkpoints_root={root / 'checkpoints'}",
        "stage=bench",
        "models=tiny_random",
        "experiment=frontier",
        "data.max_prompt_tokens=48",
        "bench.num_prompts=3",
        "bench.max_new_tokens=10",
        "bench.batch_sizes=[]",
        "bench.gamma_max=3",
        "bench.latency.reps=1",
        "bench.judge.enabled=false",
        "bench.energy=false",
        "bench.law_distance_prompts=0",
        "bench.min_timed_runs=1",
        "bench.guard.tau_ladder=[]",
        "bench.methods=[target_only,sprinter]",
        "++methods.sprinter.verifier.label=accept_prob",
        "bench.frontier.verifier=[0.5,0.9]",
        "bench.frontier.entropy=[0.2,0.9]",
        "bench.frontier.typical=[0.3,0.01]",
    )
    constant_accept_verifier(cfg.checkpoint_dir, 0.8)  # scores 0.8
    run_stage(cfg)
    out = Path(cfg.experiment_dir) / "bench"
    return {
        "results": read_json(out / "results.json"),
        "md": (out / "results.md").read_text(),
        "out": out,
    }


@pytest.mark.heavy  # a whole bench stage
def test_the_bench_traces_every_lossy_rule_and_reports_the_frontier(bench) -> None:
    results, md = bench["results"], bench["md"]
    frontier = results["frontier"]
    assert {e["rule"] for e in frontier} == set(RULES)
    assert all(set(e) == set(KEYS) for e in frontier)  # exactly these keys
    assert {(e["rule"], e["threshold"]) for e in frontier} == {
        ("verifier", 0.5),
        ("verifier", 0.9),
        ("entropy", 0.2),
        ("entropy", 0.9),
        ("typical", 0.3),
        ("typical", 0.01),
    }
    assert {e["method"] for e in frontier if e["rule"] != "typical"} == {"sprinter"}
    assert all(e["batch"] == 1 and e["ppl_ratio"] > 0 for e in frontier)
    # τ 0.9 is above the verifier's 0.8: the target checks every draft, sprinter is exact
    summary = results["frontier_summary"]
    assert summary["target_only_ppl"] == results["methods"]["target_only"]["target_ppl"]
    timed = [e for e in frontier if e["tokens_per_s"] is not None]
    assert timed and all(e["tokens_per_s"] > 0 for e in timed)
    flags = on_frontier(frontier)
    assert any(flags) and all(
        e["tokens_per_s"] is not None for e, on in zip(frontier, flags, strict=True) if on
    )
    assert len(summary["untimed_tokens_per_s"]) == len(frontier)
    reading = summary["verdicts"]["1"]
    assert set(reading["fastest"]) == set(RULES) and reading["bar"] == 1.1
    assert "## Lossy frontier" in md and "### Batch size 1" in md
    assert "Fastest timed point within the perplexity bar (ratio ≤ 1.1" in md
    assert "![lossy frontier](frontier.png)" in md and (bench["out"] / "frontier.png").exists()
