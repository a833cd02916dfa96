"""SPRINTER Theorems 3.1, 3.3, 3.4 and A.4 against Monte-Carlo simulations of the sampler.

The simulators below are written from the paper's description of the algorithm (§3, A.1,
Algorithm 2), independently of the formulas; every formula must land within 3 standard
errors of its simulation.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sprinter_train.evaluation.theorems import (
    E_N,
    P_N,
    E_N_truncated,
    E_T_stop,
    beta_SD,
    beta_SPRINTER,
    d_TV,
    d_TV_SPRINTER,
    p_SPRINTER,
)
from sprinter_train.evaluation.theory_checks import runs_from, theorem_checks

P = np.array([0.30, 0.25, 0.20, 0.10, 0.10, 0.05])
Q = np.array([0.10, 0.35, 0.05, 0.30, 0.15, 0.05])  # tokens 1, 3, 4 are unacceptable (q > p)
TRIALS = 200_000


def within_3_se(estimate: np.ndarray, truth: np.ndarray, se: np.ndarray) -> bool:
    return bool(np.all(np.abs(estimate - truth) <= 3 * np.maximum(se, 1e-12)))


def simulate_one_token(p, q, eta_TP, eta_FP, n, rng):
    """One SPRINTER step per trial: x ~ q; the verifier accepts an acceptable x w.p. η_TP,
    an unacceptable one w.p. η_FP; on rejection the target accepts x w.p. min(1, p/q) or
    resamples from norm(max(0, p - q)). Returns (emitted token, draft token accepted)."""
    x = rng.choice(len(q), size=n, p=q)
    acceptable = q[x] <= p[x]
    verifier = rng.random(n) < np.where(acceptable, eta_TP, eta_FP)
    target_accepts = rng.random(n) < np.minimum(1.0, p[x] / q[x])
    residual = np.maximum(p - q, 0.0)
    resampled = rng.choice(len(p), size=n, p=residual / residual.sum())
    accepted = verifier | target_accepts
    return np.where(accepted, x, resampled), accepted


@pytest.mark.parametrize(("eta_TP", "eta_FP"), [(0.9, 0.3), (0.6, 0.0), (0.8, 1.0)])
def test_theorem_3_1_distribution_and_tv(eta_TP: float, eta_FP: float) -> None:
    rng = np.random.default_rng(1)
    emitted, _ = simulate_one_token(P, Q, eta_TP, eta_FP, TRIALS, rng)
    freq = np.bincount(emitted, minlength=len(P)) / TRIALS
    expected = p_SPRINTER(P, Q, eta_FP)
    assert within_3_se(freq, expected, np.sqrt(expected * (1 - expected) / TRIALS))
    # d_TV(p, p_S) = p_S(rej) - p(rej): estimated without bias by the emitted mass on q > p
    rejected = Q > P
    mass = np.isin(emitted, np.flatnonzero(rejected)).mean()
    se = np.sqrt(mass * (1 - mass) / TRIALS)
    assert abs((mass - P[rejected].sum()) - d_TV_SPRINTER(P, Q, eta_FP)) <= 3 * max(se, 1e-12)
    assert d_TV_SPRINTER(P, Q, eta_FP) == pytest.approx(d_TV(P, p_SPRINTER(P, Q, eta_FP)))


@pytest.mark.parametrize(("eta_TP", "eta_FP"), [(0.9, 0.3), (0.5, 0.5), (1.0, 0.2)])
def test_theorem_A_4_acceptance_rate(eta_TP: float, eta_FP: float) -> None:
    rng = np.random.default_rng(2)
    _, accepted = simulate_one_token(P, Q, eta_TP, eta_FP, TRIALS, rng)
    rate = accepted.mean()
    se = np.sqrt(rate * (1 - rate) / TRIALS)
    assert abs(rate - beta_SPRINTER(eta_FP, d_TV(P, Q))) <= 3 * se
    assert beta_SPRINTER(0.0, d_TV(P, Q)) == pytest.approx(beta_SD(d_TV(P, Q)))
    assert beta_SD(d_TV(P, Q)) == pytest.approx(np.minimum(P, Q).sum())


def simulate_N(eta_TP: float, eta_FP: float, r: int, n: int, rng) -> np.ndarray:
    """Consecutive verifier accepts when the first r draft tokens are acceptable, the rest not."""
    horizon = r + 200
    rates = np.where(np.arange(horizon) < r, eta_TP, eta_FP)
    accepts = rng.random((n, horizon)) < rates
    return np.argmin(np.c_[accepts, np.zeros((n, 1), bool)], axis=1)


@pytest.mark.parametrize(
    ("eta_TP", "eta_FP", "r"), [(0.9, 0.5, 5), (0.7, 0.2, 3), (0.95, 0.6, 0), (1.0, 0.4, 4)]
)
def test_theorem_3_3_distribution_and_mean(eta_TP: float, eta_FP: float, r: int) -> None:
    rng = np.random.default_rng(3)
    n = 100_000
    runs = simulate_N(eta_TP, eta_FP, r, n, rng)
    assert within_3_se(runs.mean(), E_N(eta_TP, eta_FP, r), runs.std(ddof=1) / np.sqrt(n))
    for i in range(0, r + 3):
        prob = P_N(i, eta_TP, eta_FP, r)
        assert (
            abs((runs == i).mean() - prob) <= 3 * np.sqrt(max(prob * (1 - prob), 1e-9) / n) + 1e-4
        )
    assert sum(P_N(i, eta_TP, eta_FP, r) for i in range(400)) == pytest.approx(1.0)


@pytest.mark.parametrize(("eta_TP", "eta_FP", "r", "t_d"), [(0.9, 0.5, 5, 0.1), (0.6, 0.3, 2, 1.0)])
def test_theorem_3_4_stopping_time(eta_TP: float, eta_FP: float, r: int, t_d: float) -> None:
    """T_stop = t_d times the draft calls of a round: the N accepted tokens plus the rejected one."""
    rng = np.random.default_rng(4)
    n = 100_000
    stop = t_d * (simulate_N(eta_TP, eta_FP, r, n, rng) + 1)
    assert within_3_se(stop.mean(), E_T_stop(eta_TP, eta_FP, r, t_d), stop.std(ddof=1) / np.sqrt(n))


@pytest.mark.parametrize(("r", "L"), [(2, 3), (5, 5), (0, 4), (3, 10)])
def test_truncated_expectation_matches_a_capped_simulation(r: int, L: int) -> None:
    rng = np.random.default_rng(5)
    n = 100_000
    capped = np.minimum(simulate_N(0.8, 0.5, r, n, rng), L)
    assert within_3_se(
        capped.mean(), E_N_truncated(0.8, 0.5, r, L), capped.std(ddof=1) / np.sqrt(n)
    )
    assert E_N_truncated(0.8, 0.5, r, 10_000) == pytest.approx(E_N(0.8, 0.5, r))


def test_edge_cases_are_finite_or_explicitly_infinite() -> None:
    assert E_N(1.0, 0.0, 3) == pytest.approx(3.0)  # accepts exactly the r acceptable tokens
    assert E_N(0.0, 0.9, 3) == 0.0
    assert E_N(0.5, 1.0, 2) == float("inf")
    assert E_T_stop(1.0, 0.0, 3, 2.0) == pytest.approx(8.0)  # r + 1 draft calls
    np.testing.assert_array_equal(
        runs_from(np.array([1, 1, 0, 1, 0, 0, 1, 1, 1], bool)), [2, 1, 0, 1, 0, 0, 3, 2, 1]
    )


def record_frame(labels: np.ndarray, beta: np.ndarray, length: int, rng) -> pd.DataFrame:
    """Records of len(labels) // length prompts; min(1, p/q) is 1 on acceptable rows, and on
    the others has mean (beta - 0.6) / 0.4, so that E[min(1, p/q)] = beta when P(acceptable)
    = 0.6 (as on real records, where both estimate the same d_TV)."""
    n = len(labels)
    m = (beta - 0.6) / 0.4
    spread = np.minimum(m, 1 - m)
    accept_prob = np.where(labels, 1.0, m + spread * rng.uniform(-1, 1, n))
    prompts = n // length
    return pd.DataFrame(
        {
            "prompt_id": np.repeat([f"p{i}" for i in range(prompts)], length),
            "position": np.tile(np.arange(length), prompts),
            "mix": np.repeat(np.array(["draft", "interleaved"])[np.arange(prompts) % 2], length),
            "ratio": np.where(
                labels, rng.uniform(0.2, 1.0, n), 1.0 / np.maximum(accept_prob, 1e-3)
            ),
            "accept_prob": accept_prob,
            "beta": beta,
        }
    )


def iid_decisions(labels: np.ndarray, eta_TP: float, eta_FP: float, rng) -> np.ndarray:
    """Verifier scores whose accept decision (>= 0.5) is i.i.d. given acceptability."""
    return np.where(rng.random(len(labels)) < np.where(labels, eta_TP, eta_FP), 0.9, 0.1)


def test_record_check_of_theorem_A_4_for_an_iid_verifier() -> None:
    rng = np.random.default_rng(6)
    n = 40_000
    labels = rng.random(n) < 0.6
    frame = record_frame(labels, rng.uniform(0.65, 0.95, n), 16, rng)
    check = theorem_checks(
        frame, iid_decisions(labels, 0.85, 0.3, rng), 0.5, rng.random(n), ["draft"]
    )
    assert check["eta_TP"] == pytest.approx(0.85, abs=0.02)
    a4 = check["theorem_A_4"]
    # the tolerance adds the sampling error of d_TV's estimate (mean of 1 - beta) to the simulation's
    tv_se = frame["beta"].std() / np.sqrt(n)
    assert abs(a4["simulated_beta"] - a4["predicted_beta"]) <= 3 * np.hypot(
        a4["simulated_se"], tv_se
    )
    assert a4["beta_SD"] < a4["predicted_beta"]


def test_record_check_of_theorem_3_1_for_a_prefix_only_verifier() -> None:
    """With hidden-state features V is one decision per prefix, so a position where V accepts
    emits q and elsewhere p: d_TV(p, p_SPRINTER) = V d_TV(p, q) there. It equals the theorem's
    η_FP d_TV when V carries no information (η_TP = η_FP); an informative V differs."""
    rng = np.random.default_rng(7)
    n = 40_000
    labels = rng.random(n) < 0.6
    frame = record_frame(labels, rng.uniform(0.65, 0.95, n), 16, rng)
    check = theorem_checks(frame, iid_decisions(labels, 0.4, 0.4, rng), 0.5, rng.random(n), [])
    t31 = check["theorem_3_1"]
    se = (check["d_TV_pq"] * np.sqrt(0.4 * 0.6 / n)) + frame["beta"].std() / np.sqrt(n)
    assert abs(t31["measured_d_TV"] - t31["predicted_d_TV"]) <= 3 * se
    informative = theorem_checks(
        frame, iid_decisions(labels, 0.9, 0.2, rng), 0.5, rng.random(n), []
    )
    assert (
        informative["theorem_3_1"]["measured_d_TV"]
        > 2 * informative["theorem_3_1"]["predicted_d_TV"]
    )


def test_record_check_of_theorem_3_3_on_sequences_of_the_theorems_shape() -> None:
    """Each sequence: r acceptable tokens, then unacceptable ones (Fig. 4); i.i.d. verifier."""
    rng = np.random.default_rng(8)
    prompts, length = 3000, 12
    r = rng.integers(0, length + 1, prompts)
    labels = (np.arange(length)[None, :] < r[:, None]).ravel()
    frame = record_frame(labels, np.full(prompts * length, 0.8), length, rng)
    check = theorem_checks(
        frame,
        iid_decisions(labels, 0.85, 0.4, rng),
        0.5,
        rng.random(len(labels)),
        ["draft", "interleaved"],
    )
    t33 = check["theorem_3_3"]
    assert t33["starts"] == prompts * length
    # starts of one sequence overlap: allow 3 naive standard errors times sqrt(length)
    assert abs(t33["observed_N"] - t33["predicted_E_N"]) <= 3 * t33["observed_se_naive"] * np.sqrt(
        length
    )
    assert abs(t33["observed_N"] - t33["predicted_E_N"]) <= 0.03 * t33["predicted_E_N"]
