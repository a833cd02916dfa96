"""The online logistic (vLLM's acceptance estimator): its Newton step by hand, its refits
against a batch fit, its record score, and sd_online / sprinter learning while decoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression

from sprinter_train.core.classification import auc
from sprinter_train.core.config import compose_config
from sprinter_train.decoding.batch import Row
from sprinter_train.decoding.policies import TargetOnly, scores_before_the_draw
from sprinter_train.decoding.policies.online import OnlineLength, OnlineVerifier, online_records
from sprinter_train.decoding.policies.plans.online_logistic import OnlineLogistic, top2_margin
from sprinter_train.decoding.policies.registry import traits_of
from sprinter_train.decoding.policies.sprinter import Sprinter
from tests.decoding_helpers import GREEDY, PROMPTS, engine_for, tiny_trio

SETTINGS = dict(compose_config().methods.sd_online.online)


def estimator(**changes) -> OnlineLogistic:
    return OnlineLogistic.from_settings({**SETTINGS, **changes})


def planted(n: int, seed: int = 0, w: float = 1.3, b: float = -0.7):
    rng = np.random.default_rng(seed)
    margin = rng.exponential(1.5, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(w * margin + b)))).astype(np.float64)
    return margin, y


def test_one_refit_is_the_ridge_newton_step_by_hand() -> None:
    margin, y = planted(300)
    est = estimator(positions=2, refit_interval=10_000, min_observations=1)
    m = torch.from_numpy(margin)
    pred = est.predict(m, 1)
    est.observe(m, 1, pred, torch.from_numpy(y))
    est.refit()
    x = np.stack([margin, np.ones_like(margin)], 1)
    p = 1 / (1 + np.exp(-(SETTINGS["init_weight"] * margin + SETTINGS["init_bias"])))
    hessian = (x * (p * (1 - p))[:, None]).T @ x + SETTINGS["l2"] * np.eye(2)
    step = np.linalg.solve(hessian, x.T @ (y - p))
    expected = np.array([SETTINGS["init_weight"], SETTINGS["init_bias"]]) + step
    assert np.allclose([est.weight[1], est.bias[1]], expected, rtol=1e-10)
    assert est.weight[0] == SETTINGS["init_weight"]  # position 0 saw nothing
    assert est.bias[0] == SETTINGS["init_bias"] and est.refits == 1


def test_refits_over_the_same_outcomes_converge_to_the_batch_logistic() -> None:
    margin, y = planted(4000, seed=1)
    est = estimator(positions=1, refit_interval=len(margin), min_observations=1)
    m, labels = torch.from_numpy(margin), torch.from_numpy(y)
    for _ in range(12):
        est.observe(m, 0, est.predict(m, 0), labels)  # a refit at the interval
    batch = LogisticRegression(C=1e12, max_iter=1000, tol=1e-12).fit(margin[:, None], y)
    assert est.refits == 12
    assert np.isclose(float(est.weight[0]), batch.coef_[0, 0], rtol=1e-5)
    assert np.isclose(float(est.bias[0]), batch.intercept_[0], rtol=1e-5)


def test_a_thin_round_or_a_negative_slope_keeps_the_coefficients() -> None:
    margin, y = planted(30)
    thin = estimator(refit_interval=30, min_observations=50)
    m = torch.from_numpy(margin)
    thin.observe(m, 0, thin.predict(m, 0), torch.from_numpy(y))
    assert thin.refits == 1 and float(thin.weight[0]) == SETTINGS["init_weight"]
    flipped = estimator(refit_interval=4000, min_observations=1)
    margin, y = planted(4000, w=-2.0, b=1.0)
    m = torch.from_numpy(margin)
    flipped.observe(m, 0, flipped.predict(m, 0), torch.from_numpy(y))
    assert float(flipped.weight[0]) == SETTINGS["init_weight"]


def test_the_margin_is_top1_minus_top2() -> None:
    values = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.5, 0.0], [3.0, -1.0, float("-inf")]])
    assert torch.allclose(top2_margin(values), torch.tensor([0.5, 0.0, 4.0]))


def test_the_record_score_runs_the_same_updates_in_sequence_order() -> None:
    n = 3000
    margin, accept = planted(n, seed=2)
    rng = np.random.default_rng(0)
    prompt = np.array([f"p{i:03d}" for i in rng.integers(0, 100, n)])
    position = rng.integers(0, 50, n)
    columns = {
        "draft_margin": margin,
        "accept_prob": accept,
        "prompt_id": prompt,
        "position": position,
    }
    settings = {"online": {**SETTINGS, "refit_interval": 200, "positions": 1}}
    scores = online_records(columns, settings)
    order = np.lexsort((position, prompt))
    first = 1 / (1 + np.exp(-SETTINGS["init_bias"]))
    assert np.allclose(scores[order[:200]], first)  # scored before any refit
    by_hand = estimator(refit_interval=200, positions=1)
    for start in range(0, n, 200):  # one record at a time: the block shortcut is exact
        for row in order[start : start + 200]:
            m = torch.tensor([margin[row]])
            pred = by_hand.predict(m, 0)
            assert np.isclose(scores[row], float(pred[0]))
            by_hand.observe(m, 0, pred, torch.tensor([accept[row]]))
    assert auc(accept > 0.5, scores) > 0.7
    with_runs = online_records(
        {**columns, "run_position": position % 3}, {"online": {**SETTINGS, "refit_interval": 200}}
    )
    assert not np.allclose(with_runs, scores)  # per-position coefficients where records say


def test_sd_online_declares_its_record_score_and_scores_before_the_draw() -> None:
    traits = traits_of(compose_config().methods.sd_online, "sd_online")
    assert traits.record_score.name == "online_margin" and traits.lossless
    assert "draft_margin" in traits.record_score.columns
    assert scores_before_the_draw(OnlineVerifier(SETTINGS))


def test_the_verify_outcome_folds_in_by_vllms_rule() -> None:
    verifier = OnlineVerifier({**SETTINGS, "refit_interval": 10_000})
    row = Row(0, [1], 1, 8)
    margins = torch.tensor([1.0, 2.0, 3.0, 4.0])
    for position in range(4):
        pred = verifier.estimator.predict(margins[position : position + 1], position)
        verifier.pending.setdefault(id(row), []).append(
            (position, margins[position : position + 1], pred, pred, 0)
        )
    verifier.observe(row, drafted=4, accepted=2)  # 0, 1 accepted; 2 rejected; 3 unseen
    assert verifier.estimator.counts[:4].tolist() == [1.0, 1.0, 1.0, 0.0]
    grad = verifier.estimator.grad
    p = float(torch.sigmoid(torch.tensor(SETTINGS["init_bias"])))
    assert np.isclose(float(grad[2, 1]), -p) and np.isclose(float(grad[0, 1]), 1 - p)
    assert id(row) not in verifier.pending


@pytest.fixture(scope="module")
def models():
    return tiny_trio()


def test_sd_online_learns_while_decoding_and_keeps_the_greedy_tokens(models) -> None:
    online = {**SETTINGS, "refit_interval": 8, "min_observations": 1, "warmup_refits": 1}
    policy = OnlineLength(max_gamma=4, online=online)
    engine = engine_for(models, GREEDY)
    reference = [engine.generate([p], TargetOnly(), 24)[0].tokens for p in PROMPTS]
    result = engine.generate(PROMPTS, policy, 24)
    assert [r.tokens for r in result] == reference
    assert policy.verifier.estimator.refits > 0
    assert result[0].stats.verifier_calls > 0 and result[0].stats.verifier_seconds > 0


def test_sprinter_learns_only_from_the_tokens_the_target_checked(models) -> None:
    online = {
        **SETTINGS,
        "refit_interval": 4,
        "min_observations": 1,
        "warmup_refits": 2,
        "warmup_score": 0.0,
        "positions": 1,
    }
    verifier = OnlineVerifier(online)
    policy = Sprinter(verifier, tau=0.5, max_run=4)
    engine = engine_for(models, GREEDY)
    result = engine.generate(PROMPTS[:2], policy, 16)
    # warm-up scores 0: every draft is its round's last and the target checks it
    assert verifier.estimator.refits >= 2
    assert sum(r.stats.drafted for r in result[:1]) > 0


def test_the_bench_builds_the_online_verifier_from_a_methods_entry() -> None:
    from omegaconf import OmegaConf

    from sprinter_train.bench.run.methods import RunInputs, _verifier

    cfg = compose_config()
    node = OmegaConf.create({"verifier": {"kind": "online", "warmup_score": 0.0, "positions": 1}})
    run = RunInputs(cfg, 1, None, False, torch.device("cpu"))
    scorer, record = _verifier("sprinter", node, run)
    assert isinstance(scorer, OnlineVerifier) and record["kind"] == "online"
    assert scorer.warmup_score == 0.0 and scorer.estimator.positions == 1
    assert record["refit_interval"] == SETTINGS["refit_interval"]  # sd_online's defaults


def test_evaluate_scores_the_online_margin_after_the_fit_splits_on_every_mix(tmp_path) -> None:
    """Issue 38: on a test split of fewer rows than one refit interval the estimator never
    refitted, and the draft mix's long runs all share the last draft position, whose slope
    stays at its initial 0: constant scores, AUC exactly 0.5. Run after the train and val
    records (as a decoder runs after earlier traffic), every mix is ranked."""
    from sprinter_train.evaluation.scores import predictor_scores
    from sprinter_train.harvest.reader import open_records
    from tests.synthetic import write_synthetic_records

    write_synthetic_records(tmp_path / "syn", rows=2048, d=8, positions=32)
    records = open_records(tmp_path / "syn")
    frame = records.frame
    draft = (frame["mix"] == "draft").to_numpy()
    # a draft continuation: each row's run of draft-made tokens is its index in the region
    frame.loc[draft, "run_position"] = frame.loc[draft, "position"] - 16
    rows = records.rows_of("test")
    cfg = compose_config()
    assert len(rows) < cfg.methods.sd_online.online.refit_interval  # no refit inside the split
    scores = predictor_scores(cfg, records, rows, {}, None)["online_margin"]
    mixes = frame["mix"].to_numpy()[rows]
    label = frame["ratio"].to_numpy()[rows] <= 1.0
    assert {"draft", "original"} <= set(mixes)
    for mix in set(mixes):
        here = mixes == mix
        assert len(np.unique(scores[here])) > 1, mix
        assert auc(label[here], scores[here]) > 0.6, mix
    alone = online_records(
        {
            c: frame[c].to_numpy()[rows]
            for c in ("draft_margin", "accept_prob", "prompt_id", "position", "run_position")
        },
        {"online": SETTINGS},
    )
    assert len(np.unique(alone)) == 1  # the failure it fixes: the split alone never refits
