"""Every acceptance predictor's P(accept) estimate on the same rows, and what each one is.

SPRINTER's verifiers (one per λ) score the records' hidden states; SV's table looks up
(S, A); SVIP, AdaEDL and q(x) need no training.
"""

from __future__ import annotations

import numpy as np
from omegaconf import DictConfig

from sprinter_train.evaluation.calibration import probabilities
from sprinter_train.evaluation.predictors import adaedl_bound, draft_q, svip_score
from sprinter_train.harvest.reader import RecordSet
from sprinter_train.sv.table import SVTable
from sprinter_train.verifier.checkpoint import VerifierCheckpoint
from sprinter_train.verifier.features import build_features
from sprinter_train.verifier.train import make_embedder


def verifier_logits(
    cfg: DictConfig, records: RecordSet, rows: np.ndarray, verifiers: dict[str, VerifierCheckpoint]
) -> dict[str, np.ndarray]:
    """Each verifier's logit on the given rows (hidden states read once); the logits, not the
    scores, so that a temperature can be applied without losing the tails to rounding."""
    hidden = records.hidden(rows)
    columns = {c: records.frame[c].to_numpy()[rows] for c in ("q", "draft_entropy", "token_id")}
    out = {}
    for name, checkpoint in verifiers.items():
        if int(checkpoint.meta["d"]) != records.d:
            raise ValueError(
                f"{name} was trained on d={checkpoint.meta['d']} hidden states; the records of "
                f"{records.records_dir} have d={records.d} (another draft or layer)"
            )
        embedder = make_embedder(cfg, checkpoint.spec, records)
        features = build_features(checkpoint.spec, hidden, columns, embedder)
        out[name] = checkpoint.logits(features.batch())
    return out


def verifier_scores(
    cfg: DictConfig, records: RecordSet, rows: np.ndarray, verifiers: dict[str, VerifierCheckpoint]
) -> dict[str, np.ndarray]:
    """Each verifier's sigmoid score (uncalibrated) on the given rows."""
    logits = verifier_logits(cfg, records, rows, verifiers)
    return {name: probabilities(value) for name, value in logits.items()}


def predictor_scores(
    cfg: DictConfig,
    records: RecordSet,
    rows: np.ndarray,
    logits: dict[str, np.ndarray],
    table: SVTable | None,
) -> dict[str, np.ndarray]:
    """P(accept) estimates of every predictor on the same rows (verifiers: sigmoid of
    `logits`, uncalibrated, as the sidecar's weights give them)."""
    frame = records.frame.iloc[rows]
    scores = {name: probabilities(value) for name, value in logits.items()}
    if table is not None:
        scores["sv_table"] = np.asarray(table.lookup(frame["S"].to_numpy(), frame["A"].to_numpy()))
    entropy = frame["draft_entropy"].to_numpy()
    scores["svip_entropy"] = svip_score(entropy, cfg.methods.svip)
    scores["adaedl_bound"] = adaedl_bound(entropy, cfg.methods.adaedl)
    scores["draft_q"] = draft_q(frame["q"].to_numpy())
    return scores


def predictor_descriptions(
    cfg: DictConfig, verifiers: dict[str, VerifierCheckpoint]
) -> dict[str, str]:
    """One line per predictor for the report: what its score is, and for the entropy rules
    which H(q) (the records hold only the warped draft's; the bench's rules may read the raw)."""
    return {
        **{n: verifier_description(c) for n, c in verifiers.items()},
        "sv_table": "SV P(accept | S, A), default binning of tables/sv_table.json",
        "svip_entropy": f"SVIP 1 - sqrt({cfg.methods.svip.c} H_q)"
        + entropy_note(cfg.methods.svip, "svip"),
        "adaedl_bound": f"AdaEDL 1 - sqrt({cfg.methods.adaedl.gamma} H_q)"
        + entropy_note(cfg.methods.adaedl, "adaedl"),
        "draft_q": "q(x), the draft's probability of its token",
    }


def verifier_description(checkpoint: VerifierCheckpoint) -> str:
    """What a verifier was trained on: the label q/p <= λ, or the soft label min(1, p/q)."""
    if checkpoint.label == "accept_prob":
        return "SPRINTER verifier trained on the soft label min(1, p/q) (SpecDec++'s target)"
    return f"SPRINTER verifier trained at λ={checkpoint.lam:g}"


def entropy_note(method: DictConfig, name: str) -> str:
    """Which H_q the score used: always the records' draft_entropy (warped q); when the bench's
    rule reads the raw softmax entropy, say that the two differ instead of hiding it."""
    used = ", H_q = the records' draft_entropy (of the warped draft distribution)"
    if method.get("warped_entropy", False):
        return used + ", as the bench's rule"
    return (
        used + f"; the bench's rule reads the raw softmax entropy (methods.{name}.warped_entropy="
        "false), which the records do not hold, so this AUC describes the warped-H rule"
    )
