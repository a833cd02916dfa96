"""bench.summary on hand-made runs: every column of results.json against its definition.

Outputs are chosen so ROUGE-L is known by hand (the tiny tokenizer decodes "abc" as the words
a, b, c); the target's perplexity is the one model call, checked as the mean over prompts.
"""

from __future__ import annotations

import pytest

from sprinter_train.bench.quality.scores import target_perplexity
from sprinter_train.bench.report.summary import summarise
from sprinter_train.bench.run.runs import GroupRun
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.batch import DecodeStats
from sprinter_train.models.loading import LoadedModel
from sprinter_train.models.roles import Roles
from sprinter_train.models.tiny import build_tiny_model, build_tiny_tokenizer

TOKENIZER = build_tiny_tokenizer()


def ids(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False)


PROMPTS = [
    Prompt("p0", "syn", "test", "first", ids("first"), reference="a b d"),
    Prompt("p1", "syn", "test", "second", ids("second"), reference=None),
]


@pytest.fixture(scope="module")
def models() -> Roles:
    target = build_tiny_model({}, seed=0)
    return Roles(
        draft=LoadedModel("draft", target, TOKENIZER),
        target=LoadedModel("target", target, TOKENIZER),
        companion=None,
        vocab_size=128,
        eos_token_id=TOKENIZER.eos_token_id,
    )


def run(prompt: Prompt, text: str, wall: float, stats: DecodeStats, joules: float | None):
    reason = "no meter" if joules is None else None
    return GroupRun([prompt], [ids(text)], wall, stats, joules, reason)


def hand_made_runs() -> dict[str, list[GroupRun]]:
    """target_only; sd with the same output on p0 and a disjoint one on p1; sprinter with a
    verifier and an empty output on p1."""
    return {
        "target_only": [
            run(
                PROMPTS[0],
                "abc",
                1.0,
                DecodeStats(target_calls=3, target_seconds=0.25, target_prefill_seconds=0.125),
                1.5,
            ),
            run(PROMPTS[1], "xyz", 0.5, DecodeStats(target_calls=3, target_seconds=0.125), 1.5),
        ],
        "sd": [
            run(
                PROMPTS[0],
                "abc",
                0.25,
                DecodeStats(
                    target_calls=1, draft_calls=2, drafted=2, accepted=2, draft_seconds=0.5
                ),
                None,
            ),
            run(
                PROMPTS[1],
                "pq",
                0.25,
                DecodeStats(
                    target_calls=2, draft_calls=2, drafted=2, accepted=0, draft_seconds=0.25
                ),
                2.0,
            ),
        ],
        "sprinter": [
            run(
                PROMPTS[0],
                "abd",
                0.5,
                DecodeStats(
                    target_calls=1,
                    draft_calls=5,
                    verifier_calls=5,
                    drafted=5,
                    accepted=1,
                    verifier_accepted=3,
                    verifier_seconds=0.0625,
                ),
                None,
            ),
            run(PROMPTS[1], "", 0.5, DecodeStats(target_calls=1), None),
        ],
    }


def test_speed_calls_and_acceptance_follow_from_the_runs(models, compose_cfg) -> None:
    cfg = compose_cfg("bench.judge.enabled=false")
    out = summarise(hand_made_runs(), models, TOKENIZER, cfg)
    assert out["judge"] is None
    base, sd, sprinter = (out["methods"][n] for n in ("target_only", "sd", "sprinter"))
    assert (base["tokens"], base["wall_s"], base["tokens_per_s"]) == (6, 1.5, 4.0)
    assert (sd["tokens"], sd["wall_s"], sd["tokens_per_s"]) == (5, 0.5, 10.0)
    assert (sprinter["tokens"], sprinter["tokens_per_s"]) == (3, 3.0)
    assert sd["speedup_vs_target_only"] == 2.5 and base["speedup_vs_sd"] == 0.4
    assert sprinter["speedup_vs_target_only"] == 0.75 and sprinter["speedup_vs_sd"] == 0.3
    assert (sd["target_calls"], sd["draft_calls"], sd["companion_calls"]) == (3, 4, 0)
    assert sd["tokens_per_target_call"] == pytest.approx(5 / 3)
    assert base["tokens_per_target_call"] == 1.0 and sprinter["tokens_per_target_call"] == 1.5
    # sd: the target kept 2 of its 4 checked drafts; sprinter: 3 of 5 drafts went on the
    # verifier's word, the target kept 1 of the other 2
    assert sd["acceptance_rate"] == 0.5 and sd["verifier_acceptance_rate"] is None
    assert sprinter["acceptance_rate"] == 0.5 and sprinter["verifier_acceptance_rate"] == 0.6
    assert base["acceptance_rate"] is None
    assert sd["time_breakdown_s"] == {
        "target": 0.0,
        "draft": 0.75,
        "companion": 0.0,
        "verifier": 0.0,
    }
    assert base["time_breakdown_s"]["target"] == 0.375
    # the prompts' prefill is inside the target's seconds: a call costs the rest
    assert base["prefill_s"] == {"target": 0.125, "draft": 0.0, "companion": 0.0}
    assert base["cost_ms"]["target_call"] == pytest.approx(1e3 * 0.25 / 6)
    assert sprinter["time_breakdown_s"]["verifier"] == 0.0625
    # energy only when every run of a method was metered
    assert base["joules_per_token"] == 0.5 and base["energy_note"] is None
    assert sd["joules_per_token"] is None and sd["energy_note"] == "no meter"


def test_quality_columns_against_hand_computed_rouge_and_perplexity(models, compose_cfg) -> None:
    out = summarise(hand_made_runs(), models, TOKENIZER, compose_cfg("bench.judge.enabled=false"))
    base, sd, sprinter = (out["methods"][n] for n in ("target_only", "sd", "sprinter"))
    # against target_only: identical on p0 (1), no common word on p1 (0); sprinter's "a b d"
    # shares a, b with "a b c" (F1 2/3) and its empty p1 output scores 0
    assert base["rouge_l_vs_target"] == 100.0
    assert sd["rouge_l_vs_target"] == 50.0
    assert sprinter["rouge_l_vs_target"] == pytest.approx(100 * (2 / 3) / 2)
    # against the reference, only p0 has one: "a b c" vs "a b d" is 2/3, "a b d" matches
    assert base["rouge_l_ref"] == pytest.approx(100 * 2 / 3) == sd["rouge_l_ref"]
    assert sprinter["rouge_l_ref"] == 100.0
    target = models.target.model
    ppl = {
        (p.prompt_id, text): target_perplexity(target, p.input_ids, ids(text))
        for p, text in ((PROMPTS[0], "abc"), (PROMPTS[1], "xyz"), (PROMPTS[1], "pq"))
    }
    assert base["target_ppl"] == pytest.approx((ppl["p0", "abc"] + ppl["p1", "xyz"]) / 2)
    assert sd["target_ppl"] == pytest.approx((ppl["p0", "abc"] + ppl["p1", "pq"]) / 2)
    # the empty output has no perplexity: the mean is over the prompt that has one
    assert sprinter["target_ppl"] == pytest.approx(
        target_perplexity(target, PROMPTS[0].input_ids, ids("abd"))
    )


def test_win_tie_against_the_baseline_with_the_local_judge(models, compose_cfg) -> None:
    cfg = compose_cfg("bench.judge.enabled=true", "bench.judge.local=target")
    out = summarise(hand_made_runs(), models, TOKENIZER, cfg)
    assert out["judge"] == "LocalJudge"
    baseline = cfg.bench.judge.baseline
    assert baseline == "sd" and f"win_tie_vs_{baseline}" not in out["methods"][baseline]
    verdict = out["methods"]["target_only"]["win_tie_vs_sd"]
    # p0: target_only and sd said the same thing, which can only tie whatever the judge says
    assert verdict["n"] == 2 and verdict["ties"] >= 1
    assert verdict["wins"] + verdict["ties"] + verdict["losses"] == 2
    assert verdict["win_tie_rate"] == (verdict["wins"] + verdict["ties"]) / 2


def test_the_judge_is_off_unless_an_endpoint_or_a_local_judge_is_asked_for(
    models, compose_cfg, capsys
) -> None:
    out = summarise(hand_made_runs(), models, TOKENIZER, compose_cfg())
    assert out["judge"] is None
    assert all(not k.startswith("win_tie") for row in out["methods"].values() for k in row)
    assert "judge" not in capsys.readouterr().err


def test_a_judge_that_runs_shows_a_progress_bar(models, compose_cfg, capsys) -> None:
    summarise(hand_made_runs(), models, TOKENIZER, compose_cfg("bench.judge.local=draft"))
    err = capsys.readouterr().err
    assert "judge" in err and "pair" in err


def test_without_target_only_or_sd_the_relative_columns_are_absent(models, compose_cfg) -> None:
    runs = {"sprinter": hand_made_runs()["sprinter"]}
    out = summarise(runs, models, TOKENIZER, compose_cfg("bench.judge.enabled=false"))
    row = out["methods"]["sprinter"]
    assert row["speedup_vs_target_only"] is None and row["speedup_vs_sd"] is None
    assert "rouge_l_vs_target" not in row
