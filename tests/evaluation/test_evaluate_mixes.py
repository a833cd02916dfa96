"""Per-mix AUCs and the feature ablation on records with a planted structure."""

from __future__ import annotations

import numpy as np

from sprinter_train.core.classification import auc
from sprinter_train.evaluation.ablation import ablate
from sprinter_train.evaluation.bootstrap import PromptBootstrap
from sprinter_train.evaluation.limit_sections import ablation_section
from sprinter_train.evaluation.mixes import ALL, mix_metrics, named_rows
from sprinter_train.evaluation.predictor_sections import mix_section

BOOT = {"resamples": 200, "seed": 0, "level": 0.95}


def mixed_rows(prompts: int = 80, per_prompt: int = 10, seed: int = 0):
    """One mix per prompt (as the harvest assigns); the score ranks the label perfectly on
    `original` and is noise on `interleaved`."""
    rng = np.random.default_rng(seed)
    mixes_of = np.array(["original", "draft", "target", "interleaved"])[np.arange(prompts) % 4]
    prompt = np.repeat(np.arange(prompts), per_prompt)
    mix = mixes_of[prompt]
    y = rng.random(len(prompt)) < 0.5
    noise = rng.random(len(prompt))
    informative = np.where(y, 0.6, 0.4) + 0.1 * noise
    score = np.where(mix == "interleaved", noise, informative)
    return y, mix, prompt.astype(str), {"verifier_x": score, "draft_q": noise}


def test_each_mix_is_scored_on_its_own_rows_with_its_own_prompts() -> None:
    y, mix, prompt, scores = mixed_rows()
    out = mix_metrics(scores, y, mix, prompt, BOOT)
    assert list(out) == ["original", "draft", "target", "interleaved", ALL]
    assert out["original"]["auc"]["verifier_x"] == 1.0
    assert abs(out["interleaved"]["auc"]["verifier_x"] - 0.5) < 0.15
    assert out[ALL]["auc"]["verifier_x"] == auc(y, scores["verifier_x"])
    assert out["original"]["prompts"] == 20 and out["original"]["rows"] == 200
    assert out[ALL]["rows"] == len(y)
    rows = mix == "interleaved"
    expected = PromptBootstrap.from_cfg(BOOT, prompt[rows]).auc_interval(
        y[rows], scores["verifier_x"][rows]
    )
    assert out["interleaved"]["auc_ci"]["verifier_x"] == expected
    lo, hi = out["interleaved"]["auc_ci"]["verifier_x"]
    assert lo < hi < 0.8  # noise there, whatever the pooled AUC


def test_the_verifier_is_named_on_the_decoders_mix_and_the_papers() -> None:
    y, mix, prompt, scores = mixed_rows()
    by_mix = mix_metrics(scores, y, mix, prompt, BOOT, ["original", "interleaved"])
    assert list(by_mix) == ["original", "interleaved", ALL]
    named = named_rows(by_mix, ["verifier_x"])
    assert named["verifier_x on original (SPRINTER Fig. 3)"]["auc"] == 1.0
    assert named["verifier_x on interleaved (decoder)"]["mix"] == "interleaved"
    text = mix_section({"by_mix": by_mix, "verifier_by_mix": named})
    assert "interleaved (20 prompts)" in text and "verifier_x on original" in text
    assert mix_metrics(scores, y, mix, prompt, BOOT, []) == {}


def planted_blocks(n: int = 3000, seed: int = 0):
    """`q` decides the label; `hidden` and `draft_entropy` are noise."""
    rng = np.random.default_rng(seed)
    blocks = {
        "hidden": rng.normal(size=(n, 5)).astype(np.float32),
        "q": rng.random((n, 1)).astype(np.float32),
        "draft_entropy": rng.random((n, 1)).astype(np.float32),
    }
    ratio = np.where(blocks["q"][:, 0] > 0.5, 0.5, np.inf)
    split = rng.choice(np.array(["train", "val", "test"]), n, p=[0.6, 0.2, 0.2])
    return blocks, ratio, split


def test_the_group_that_carries_the_label_shows_the_drop_one_loss() -> None:
    blocks, ratio, split = planted_blocks()
    out = ablate(blocks, ratio, split, 1.2, "hidden", [1e-2, 1.0])
    assert out["groups"] == ["hidden", "q", "draft_entropy"]  # feature_order()
    assert out["all"]["test_auc"] > 0.97
    assert out["drop_one"]["q"]["loss"] > 0.3
    assert abs(out["drop_one"]["hidden"]["loss"]) < 0.03
    assert abs(out["drop_one"]["draft_entropy"]["loss"]) < 0.03
    assert out["add_one"]["q"]["gain"] > 0.3 and out["add_one"]["q"]["groups"] == ["hidden", "q"]
    assert abs(out["add_one"]["draft_entropy"]["gain"]) < 0.05
    assert out["add_one_mode"] == "hidden + one group"
    text = ablation_section(
        {"ablation": {**out, "lam": 1.2, "rows": {"train": 1, "val": 1, "test": 1}, "seconds": 0.5}}
    )
    assert "drop q" in text and "add draft_entropy" in text


def test_without_a_base_each_group_is_fitted_alone() -> None:
    blocks, ratio, split = planted_blocks(n=1500)
    out = ablate(blocks, ratio, split, 1.2, None, [1.0])
    assert out["add_one_mode"] == "each group alone"
    assert set(out["add_one"]) == {"hidden", "q", "draft_entropy"}
    assert out["add_one"]["q"]["test_auc"] > 0.97 > 0.6 > out["add_one"]["hidden"]["test_auc"]
    assert "gain" not in out["add_one"]["q"]
