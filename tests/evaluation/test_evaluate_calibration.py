"""Verifier calibration in the report: the sidecar's temperature applied to the logits, each
verifier judged against its own target and the sampled event, and the before/after diagram."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sprinter_train.core.classification import brier, ece
from sprinter_train.evaluation.calibration import calibration_report, probabilities
from sprinter_train.evaluation.plots import plot_calibration
from sprinter_train.evaluation.predictor_sections import calibration_section
from sprinter_train.verifier.checkpoint import LinearVerifier, VerifierCheckpoint


def checkpoint(meta: dict) -> VerifierCheckpoint:
    return VerifierCheckpoint(LinearVerifier(2), {"d": 2, **meta}, Path("unused"))


def overconfident(seed: int = 0, n: int = 20_000):
    """Logits twice too large: the truth is sigmoid(z / 2), so T = 2 is the right temperature.
    Acceptable (q/p = 0.5) with that probability, else q/p = 3 (unacceptable at λ = 1.2)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 3.0, n).astype(np.float32)
    truth = 1.0 / (1.0 + np.exp(-z.astype(np.float64) / 2.0))
    acceptable = rng.random(n) < truth
    frame = pd.DataFrame(
        {"ratio": np.where(acceptable, 0.5, 3.0), "accept_prob": truth}  # soft label: the truth
    )
    event = rng.random(n) < truth
    return z, frame, acceptable, event


def test_the_sidecars_temperature_fixes_an_overconfident_verifier() -> None:
    z, frame, acceptable, event = overconfident()
    verifiers = {
        "verifier_lam1.2": checkpoint(
            {"lam": 1.2, "calibration": {"temperature": 2.0, "fitted_on": "val"}}
        ),
        "verifier_lam1.5": checkpoint({"lam": 1.5}),  # an old sidecar: no calibration, T = 1
    }
    logits = {name: z for name in verifiers}
    out = calibration_report(verifiers, logits, frame, event, 10)
    fitted, old = out["verifier_lam1.2"], out["verifier_lam1.5"]
    assert fitted["label"] == "ratio" and fitted["target"] == "q/p <= 1.2"
    after = 1.0 / (1.0 + np.exp(-z / 2.0))
    own = fitted["own_target"]
    assert own["ece_before"] == pytest.approx(ece(acceptable, probabilities(z), 10))
    assert own["ece_after"] == pytest.approx(ece(acceptable, after, 10), abs=1e-6)
    assert own["brier_after"] == pytest.approx(brier(acceptable, after), abs=1e-6)
    assert own["ece_after"] < 0.02 < 0.05 < own["ece_before"]
    assert own["brier_after"] < own["brier_before"]
    assert fitted["sampled"]["ece_after"] < fitted["sampled"]["ece_before"]
    assert old["temperature"] == 1.0 and old["fitted_on"] is None
    assert old["own_target"]["ece_after"] == old["own_target"]["ece_before"]
    text = calibration_section({"verifier_calibration": out, "config": {"ece_bins": 10}})
    assert text is not None and "(none fitted)" in text
    assert f"{own['ece_before']:.3f} -> {own['ece_after']:.3f}" in text


def test_the_soft_label_verifier_is_judged_against_min_1_p_over_q(tmp_path) -> None:
    z, frame, _, event = overconfident(seed=1)
    soft = checkpoint(
        {
            "lam": None,
            "label": "accept_prob",
            "calibration": {"temperature": 2.0, "fitted_on": "val"},
        }
    )
    out = calibration_report({"verifier_accept": soft}, {"verifier_accept": z}, frame, event, 10)
    entry = out["verifier_accept"]
    assert entry["label"] == "accept_prob" and entry["target"] == "min(1, p/q)"
    truth = frame["accept_prob"].to_numpy()
    # against its own soft target the calibrated score is the truth: no error left
    assert entry["own_target"]["ece_after"] == pytest.approx(0.0, abs=1e-6)
    assert entry["own_target"]["brier_after"] == pytest.approx(0.0, abs=1e-10)
    # against the sampled event, Brier keeps the event's own variance E[a (1 - a)]
    assert entry["sampled"]["brier_after"] == pytest.approx(np.mean(truth * (1 - truth)), abs=0.005)
    path = plot_calibration(out, tmp_path / "reliability_verifiers.png")
    assert path.stat().st_size > 1000
