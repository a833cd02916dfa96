"""Does each verifier beat its own inputs?

A learner whose inputs include a feature should rank at least as well as that feature alone.
This section scores, on the report's rows: every scalar input of the verifiers alone (its
sign chosen on the val split, so the test rows choose nothing), beside the hand rules the
report already scores (SVIP's and AdaEDL's entropy rules, SV's table, the online margin
estimator, q(x)); and each verifier's AUC minus each of theirs, with the paired interval over
the same prompt resamples (above 0: the verifier ranks better). It also lists the model
selection train.select recorded in each verifier's sidecar (verifier/select.py): every
candidate's val AUC and which one was kept. evaluation/limit_sections.py renders it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sprinter_train.core.classification import auc
from sprinter_train.evaluation.bootstrap import PromptBootstrap
from sprinter_train.harvest.reader import RecordSet
from sprinter_train.verifier.checkpoint import VerifierCheckpoint
from sprinter_train.verifier.features import FeatureSpec, build_features

PREFIX = "input:"  # the report's name of a feature scored alone


def scalar_inputs(
    records: RecordSet, rows: np.ndarray, verifiers: Mapping[str, VerifierCheckpoint]
) -> dict[str, np.ndarray]:
    """Each scalar feature any verifier reads, on `rows`, oriented to rank acceptance (the
    sign that gives the higher AUC against q/p <= 1 on the val split; + without val rows)."""
    settings: dict[str, Any] = {}
    names: list[str] = []
    for checkpoint in verifiers.values():
        spec = checkpoint.spec
        settings.update(spec.describe())
        names += [n for n in spec.scalars if n not in names]
    frame = records.frame
    val = records.rows_of("val")
    ratio = frame["ratio"].to_numpy()
    out: dict[str, np.ndarray] = {}
    for name in names:
        spec = FeatureSpec.from_names([name], settings)
        if any(c not in frame.columns for c in spec.record_columns()):
            continue

        def values(at: np.ndarray, spec: FeatureSpec = spec) -> np.ndarray:
            columns = {c: frame[c].to_numpy()[at] for c in spec.record_columns()}
            empty = np.zeros((len(at), 0), np.float16)
            return build_features(spec, empty, columns).batch().numpy()[:, 0].astype(np.float64)

        sign = 1.0
        if len(val):
            val_auc = auc(ratio[val] <= 1.0, values(val))
            sign = -1.0 if val_auc is not None and val_auc < 0.5 else 1.0
        out[f"{PREFIX}{name}"] = sign * values(np.asarray(rows))
    return out


def beats_inputs(
    records: RecordSet,
    rows: np.ndarray,
    verifiers: Mapping[str, VerifierCheckpoint],
    scores: Mapping[str, np.ndarray],
    y_label: np.ndarray,
    bootstrap: PromptBootstrap,
) -> dict[str, Any]:
    """{rivals: {name: {auc, auc_ci}}, versus: {verifier: {rival: {value, ci}}}, best_rival,
    selection: {verifier: the sidecar's train.select record or None}}."""
    names = list(verifiers)
    rivals = {n: s for n, s in scores.items() if n not in verifiers}
    rivals.update(scalar_inputs(records, rows, verifiers))
    resampled = {n: bootstrap.aucs(y_label, s) for n, s in {**rivals, **scores}.items()}
    table = {
        n: {"auc": auc(y_label, s), "auc_ci": bootstrap.interval(resampled[n])}
        for n, s in rivals.items()
    }
    defined = {n: e["auc"] for n, e in table.items() if e["auc"] is not None}
    best = max(defined, key=defined.__getitem__) if defined else None
    versus: dict[str, Any] = {}
    for name in names:
        mine = auc(y_label, scores[name])
        versus[name] = {
            rival: {
                "value": None if mine is None or entry["auc"] is None else mine - entry["auc"],
                "ci": bootstrap.interval(resampled[name] - resampled[rival]),
            }
            for rival, entry in table.items()
        }
    return {
        "rivals": table,
        "best_rival": best,
        "versus": versus,
        "selection": {n: c.meta.get("selection") for n, c in verifiers.items()},
    }
