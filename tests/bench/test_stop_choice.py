"""The bench chooses sd_learned's stop rule at each batch size on the val records
(bench/run/stop_choice.py): the policy runs the rule of most modelled tokens/s, results.json
records every candidate's rate, and without records the goodput rule stands, saying why."""

from __future__ import annotations

from pathlib import Path

import torch

from sprinter_train.bench.report.learned_lines import stop_rule_line
from sprinter_train.bench.run.methods import plan_methods
from sprinter_train.bench.run.stop_choice import choose_stop_rules
from sprinter_train.bench.timing.latency import LatencyProfile
from sprinter_train.decoding.policies.plans.stop_rules import StopRule, StopRules
from sprinter_train.models.tiny import build_tiny_model
from sprinter_train.verifier.checkpoint import save_verifier, verifier_path
from sprinter_train.verifier.labels import Label
from tests.synthetic import write_synthetic_records

PROFILE = LatencyProfile({1: 30.0, 2: 31.0, 3: 33.0, 4: 36.0}, 3.0, 2.0, 128, "cpu", "float32")
DEAR = LatencyProfile({1: 30.0, 2: 60.0, 3: 90.0, 4: 120.0}, 25.0, 2.0, 128, "cpu", "float32")


def experiment(compose_cfg, tmp_path: Path, *extra: str):
    here = ("stage=bench", "experiment=syn", f"checkpoints_root={tmp_path / 'ck'}", *extra)
    cfg = compose_cfg(*here, "bench.gamma_max=3")
    write_synthetic_records(Path(cfg.experiment_dir), rows=8192, d=8, shard_rows=4096)
    path = verifier_path(cfg.checkpoint_dir, Label("accept_prob"))
    path.parent.mkdir(parents=True)
    meta = {"lam": None, "label": "accept_prob", "features": {"names": ["hidden"]}, "d": 8}
    weight = torch.linspace(-1, 1, 8)
    save_verifier(path, weight, torch.zeros(1), meta)
    return cfg


def test_the_rule_of_most_modelled_tokens_is_chosen_per_batch_size(compose_cfg, tmp_path):
    cfg = experiment(compose_cfg, tmp_path)
    plan = plan_methods(cfg, 3, build_tiny_model({}, seed=0), False)
    before = plan.policies["sd_learned"]
    assert before.stop_rule is None  # auto: goodput until the bench chooses
    choose_stop_rules(cfg, plan.policies, plan.settings, PROFILE, [1, 4])
    policy = plan.policies["sd_learned"]
    assert isinstance(policy.stop_rule, StopRules) and set(policy.stop_rule.by_batch) == {1, 4}
    record = plan.settings["sd_learned"]["stop_rule"]
    assert record["round_starts"] > 0 and "val" in record["chosen_on"]
    for size, choice in record["by_batch"].items():
        rates = choice["candidates"]
        assert choice["modelled_tokens_per_s"] == max(rates.values())
        assert {"none", "goodput"} <= set(rates) and len(rates) == 2 + 12  # conf's grid
        assert policy.stop_rule.at(int(size)).rule == choice["rule"]
    # results.json's tally of the rules rounds ran by is the policy's own, filled as it runs
    assert record["rounds_by_rows_and_rule"] is policy.stop_rule.rounds
    assert sum(sum(t.values()) for t in record["rounds_by_rows_and_rule"].values()) == 2
    dear = plan_methods(cfg, 3, build_tiny_model({}, seed=0), False)
    choose_stop_rules(cfg, dear.policies, dear.settings, DEAR, [1])
    assert dear.policies["sd_learned"].stop_rule.at(1).rule == "none"  # drafting cannot pay


def test_without_records_the_goodput_rule_stands_and_says_why(compose_cfg, tmp_path):
    cfg = experiment(compose_cfg, tmp_path)
    plan = plan_methods(cfg, 3, build_tiny_model({}, seed=0), False)
    for shard in (Path(cfg.experiment_dir) / "records").iterdir():
        shard.unlink() if shard.is_file() else None
    choose_stop_rules(cfg, plan.policies, plan.settings, PROFILE, [1])
    assert plan.policies["sd_learned"].stop_rule is None
    record = plan.settings["sd_learned"]["stop_rule"]
    assert record["rule"] == "goodput" and "stage=harvest" in record["why"]


def test_results_md_says_which_rules_the_rounds_ran_by(compose_cfg, tmp_path):
    """results.md names the rules the rounds went by, beside the choice made before the run
    (a re-choice at the run's own timings may replace it)."""
    cfg = experiment(compose_cfg, tmp_path)
    plan = plan_methods(cfg, 3, build_tiny_model({}, seed=0), False)
    choose_stop_rules(cfg, plan.policies, plan.settings, PROFILE, [1])
    rules = plan.policies["sd_learned"].stop_rule
    for _ in range(3):
        rules.at(1)
    rules.by_batch[2] = StopRule("none")
    rules.at(2)
    line = stop_rule_line(plan.settings["sd_learned"])
    first = rules.by_batch[1].describe()
    assert f"rows 1: {first} × 3; rows 2: none × 1." in line
