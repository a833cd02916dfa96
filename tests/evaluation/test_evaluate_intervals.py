"""The AUC intervals: the vectorised prompt bootstrap against a loop of sklearn calls, and
resampling by prompt against resampling rows."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from sprinter_train.core.classification import weighted_auc
from sprinter_train.evaluation.bootstrap import PromptBootstrap


def prompts_with_rows(seed: int, prompts: int = 12, most_rows: int = 9):
    """Prompts of 1..most_rows rows each; coarse scores (ties on purpose), labels tied to
    the score and to a per-prompt offset, so prompts differ."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, most_rows + 1, prompts)
    ids = np.repeat(rng.permutation(1000)[:prompts], sizes)  # unsorted, gappy prompt ids
    offset = np.repeat(rng.normal(0, 1, prompts), sizes)
    score = np.round(rng.random(len(ids)), 1)
    y = (score + 0.3 * offset + rng.normal(0, 0.3, len(ids))) > 0.5
    return ids, y, score


@pytest.mark.parametrize("seed", [0, 1])
def test_weighted_auc_is_the_auc_of_the_rows_repeated(seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 50).astype(bool)
    score = np.round(rng.random(50), 1)
    weights = rng.integers(0, 4, (6, 50))
    weights[:, np.flatnonzero(y)[0]] += 1  # both classes in every row of weights
    weights[:, np.flatnonzero(~y)[0]] += 1
    got = weighted_auc(y, score, weights)
    for row, w in zip(got, weights, strict=True):
        keep = np.repeat(np.arange(50), w)
        assert row == pytest.approx(roc_auc_score(y[keep], score[keep]), abs=1e-12)
    one_class = weighted_auc(y, score, np.where(y, 1, 0)[None, :])
    assert np.isnan(one_class).all()  # no negatives drawn: undefined, not a number


@pytest.mark.parametrize("seed", [0, 3])
def test_interval_matches_a_brute_force_bootstrap_over_prompts(seed: int) -> None:
    """Same seed, one resample at a time: draw G prompts with replacement, stack every row of
    each drawn prompt, sklearn's AUC; the percentile interval of those equals ours."""
    ids, y, score = prompts_with_rows(seed)
    resamples = 300
    boot = PromptBootstrap.draw(ids, resamples, seed=7, level=0.9)
    unique = np.unique(ids)
    rows_of = [np.flatnonzero(ids == p) for p in unique]
    rng = np.random.default_rng(7)
    brute = []
    for _ in range(resamples):
        drawn = rng.integers(0, len(unique), len(unique))
        rows = np.concatenate([rows_of[g] for g in drawn])
        if y[rows].all() or not y[rows].any():
            continue  # undefined: left out of the interval, as PromptBootstrap does
        brute.append(roc_auc_score(y[rows], score[rows]))
    fast = boot.aucs(y, score, chunk=100)  # a small chunk: several chunks are stitched
    assert np.isfinite(fast).sum() == len(brute)
    assert np.sort(fast[np.isfinite(fast)]) == pytest.approx(np.sort(brute), abs=1e-12)
    expected = np.percentile(brute, [5.0, 95.0])
    assert boot.auc_interval(y, score) == pytest.approx(expected.tolist(), abs=1e-12)
    assert boot.describe()["prompts"] == len(unique) and boot.describe()["unit"] == "prompt"


def test_resampling_prompts_not_rows_widens_the_interval_when_rows_move_together() -> None:
    """Every prompt's rows are copies of one (label, score): the data hold 40 independent
    observations, not 400. Resampling prompts sees 40; resampling rows would see 400 and give
    an interval about sqrt(10) times too narrow."""
    rng = np.random.default_rng(0)
    prompts, rows_each = 40, 10
    score_p = rng.random(prompts)
    y_p = rng.random(prompts) < 0.3 + 0.4 * score_p
    y, score = np.repeat(y_p, rows_each), np.repeat(score_p, rows_each)
    ids = np.repeat(np.arange(prompts), rows_each)
    by_prompt = PromptBootstrap.draw(ids, 1000, seed=0).auc_interval(y, score)
    by_row = PromptBootstrap.draw(np.arange(len(y)), 1000, seed=0).auc_interval(y, score)
    assert by_prompt is not None and by_row is not None
    width_prompt, width_row = by_prompt[1] - by_prompt[0], by_row[1] - by_row[0]
    assert width_prompt > 2.0 * width_row
    # and it is the interval of the 40 prompts themselves, one row each
    alone = PromptBootstrap.draw(np.arange(prompts), 1000, seed=0).auc_interval(y_p, score_p)
    assert by_prompt == pytest.approx(alone, abs=1e-12)


def test_no_interval_without_both_classes_or_rows() -> None:
    ids = np.array([1, 1, 2, 3])
    boot = PromptBootstrap.draw(ids, 50, seed=0)
    assert boot.auc_interval(np.ones(4, dtype=bool), np.arange(4.0)) is None
    empty = PromptBootstrap.draw(np.zeros(0, dtype=np.int64), 50, seed=0)
    assert empty.auc_interval(np.zeros(0, dtype=bool), np.zeros(0)) is None
