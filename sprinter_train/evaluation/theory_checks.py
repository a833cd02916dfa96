"""SPRINTER's theorems against the records: formulas fed with measured η_TP, η_FP, d_TV and r,
next to what a verifier actually does on the same rows.

- Theorem 3.1: predicted η_FP · d_TV(p, q) against the measured E[V · d_TV(p, q)] over
  positions. With hidden-state features V depends only on the prefix, so at a position where
  V accepts SPRINTER emits q and elsewhere p, and V·d_TV is that position's exact
  d_TV(p, p_SPRINTER); token-dependent features make it the recorded token's decision only.
  The theorem lets V decide per drawn token (η_TP on acceptable, η_FP on unacceptable ones);
  a prefix-level V that accepts a position accepts every token q proposes there, so an
  informative verifier (η_TP > η_FP) sits above the prediction, and one that carries no
  information (η_TP = η_FP) on it.
- Theorem A.4: predicted 1 - (1 - η_FP) d_TV against a simulation on the records (accept iff
  V accepts or u < min(1, p/q), u seeded) and its sampling-free expectation.
- Theorem 3.3: from every start position of the `draft`/`interleaved` sequences, r = the run of
  acceptable tokens (q/p <= 1) and N = the run of verifier accepts, both cut at the L tokens
  left in the recorded region; predicted E[min(N, L)] under the theorem's distribution with
  that start's r, against the observed min(N, L).
The theorems assume decisions independent given acceptability; gaps measure how far a real
verifier (correlated with p/q within each class) is from that assumption.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from sprinter_train.core.classification import eta_rates
from sprinter_train.evaluation.theorems import E_N, E_N_truncated, beta_SD, beta_SPRINTER


def runs_from(flags: np.ndarray) -> np.ndarray:
    """run[s] = number of consecutive True values starting at s."""
    run = np.zeros(len(flags) + 1, dtype=np.int64)
    for s in range(len(flags) - 1, -1, -1):
        run[s] = run[s + 1] + 1 if flags[s] else 0
    return run[:-1]


def _mean_se(values: np.ndarray) -> tuple[float | None, float | None]:
    if len(values) == 0:
        return None, None
    se = float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else None
    return float(values.mean()), se


def run_length_check(
    frame: pd.DataFrame, acceptable: np.ndarray, accepted: np.ndarray, eta_TP: float, eta_FP: float
) -> dict[str, Any]:
    """Theorem 3.3 on recorded sequences (rows of one prompt are consecutive positions)."""
    if len(frame) == 0:
        return {"starts": 0, "note": "no records of these mixes in the split"}
    order = np.lexsort((frame["position"].to_numpy(), frame["prompt_id"].to_numpy()))
    prompts = frame["prompt_id"].to_numpy()[order]
    acc, ver = acceptable[order], accepted[order]
    bounds = np.flatnonzero(np.r_[True, prompts[1:] != prompts[:-1], True])
    r_all, n_all, l_all = [], [], []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        r_all.append(runs_from(acc[a:b]))
        n_all.append(runs_from(ver[a:b]))
        l_all.append(np.arange(b - a, 0, -1))
    r, n, left = (np.concatenate(v) for v in (r_all, n_all, l_all))
    cache: dict[tuple[int, int], float] = {}
    for key in zip(r.tolist(), left.tolist(), strict=True):
        if key not in cache:
            cache[key] = E_N_truncated(eta_TP, eta_FP, *key)
    predicted = np.array([cache[key] for key in zip(r.tolist(), left.tolist(), strict=True)])
    observed = np.minimum(n, left).astype(np.float64)
    mean_obs, se_obs = _mean_se(observed)
    by_r = {}
    for value in range(0, min(int(r.max()), 8) + 1):
        pick = r == value
        if pick.sum() >= 5:
            by_r[str(value)] = {
                "starts": int(pick.sum()),
                "predicted": float(predicted[pick].mean()),
                "observed": float(observed[pick].mean()),
            }
    return {
        "sequences": len(r_all),
        "starts": len(r),
        "mean_r": float(r.mean()),
        "mean_tokens_left": float(left.mean()),
        "predicted_E_N": float(predicted.mean()),
        "observed_N": mean_obs,
        "observed_se_naive": se_obs,
        "untruncated_E_N_at_mean_r": E_N(eta_TP, eta_FP, int(round(float(r.mean())))),
        "by_r": by_r,
        "note": "starts overlap, so the naive standard error understates the uncertainty",
    }


def theorem_checks(
    frame: pd.DataFrame,
    score: np.ndarray,
    tau: float,
    u: np.ndarray,
    mixes: list[str],
) -> dict[str, Any]:
    """All three checks for one verifier's scores on the evaluation rows of `frame`."""
    acceptable = frame["ratio"].to_numpy() <= 1.0
    accepted = np.asarray(score) >= tau
    rates = eta_rates(acceptable, score, tau)
    eta_TP, eta_FP = rates["eta_TP"], rates["eta_FP"]
    if eta_TP is None or eta_FP is None:
        return {"tau": tau, **rates, "note": "one class is missing: the rates are undefined"}
    tv = 1.0 - frame["beta"].to_numpy(dtype=np.float64)  # d_TV(p, q) = 1 - sum min(p, q)
    accept_prob = frame["accept_prob"].to_numpy(dtype=np.float64)
    simulated = accepted | (u < accept_prob)
    sim_mean, sim_se = _mean_se(simulated.astype(np.float64))
    in_mix = frame["mix"].isin(mixes).to_numpy()
    return {
        "tau": tau,
        "eta_TP": eta_TP,
        "eta_FP": eta_FP,
        "d_TV_pq": float(tv.mean()),
        "d_TV_pq_sampled": float((1.0 - accept_prob).mean()),  # E_x~q[1 - min(1, p/q)]
        "theorem_3_1": {
            "predicted_d_TV": eta_FP * float(tv.mean()),
            "measured_d_TV": float((accepted * tv).mean()),
        },
        "theorem_A_4": {
            "predicted_beta": beta_SPRINTER(eta_FP, float(tv.mean())),
            "beta_SD": beta_SD(float(tv.mean())),
            "simulated_beta": sim_mean,
            "simulated_se": sim_se,
            "expected_beta": float((accept_prob + accepted * (1.0 - accept_prob)).mean()),
        },
        "theorem_3_3": run_length_check(
            frame[in_mix], acceptable[in_mix], accepted[in_mix], eta_TP, eta_FP
        ),
    }


def check_verifiers(
    frame: pd.DataFrame,
    scores: dict[str, np.ndarray],
    names: list[str],
    tau: float,
    seed: int,
    mixes: list[str],
) -> dict[str, Any]:
    """theorem_checks for each named verifier. The simulation's u is the seeded draw of the
    sampled accept event (core.rules.sampled_acceptance with the same seed), so Theorem A.4's
    simulated acceptance and the report's sampled label share their randomness."""
    u = np.random.default_rng(seed).random(len(frame))
    return {name: theorem_checks(frame, scores[name], tau, u, mixes) for name in names}
