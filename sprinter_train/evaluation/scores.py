"""Every acceptance predictor's P(accept) estimate on the same rows, and what each one is.

SPRINTER's verifiers (one per λ) score the records' hidden states; SV's table looks up
(S, A); q(x) and every method whose traits carry a `record_score` (SVIP's and AdaEDL's
entropy rules) need no training.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from omegaconf import DictConfig

from sprinter_train.decoding.policies.base import RecordScore
from sprinter_train.decoding.policies.registry import all_traits
from sprinter_train.evaluation.calibration import probabilities
from sprinter_train.harvest.reader import RecordSet
from sprinter_train.sv.table import SVTable
from sprinter_train.verifier.checkpoint import VerifierCheckpoint
from sprinter_train.verifier.data import rows_features
from sprinter_train.verifier.embedder import make_embedder


def verifier_logits(
    cfg: DictConfig, records: RecordSet, rows: np.ndarray, verifiers: dict[str, VerifierCheckpoint]
) -> dict[str, np.ndarray]:
    """Each verifier's logit on the given rows (each recorded array read once); the logits,
    not the scores, so that a temperature can be applied without losing the tails to
    rounding."""
    arrays: dict[str, np.ndarray] = {}
    out = {}
    for name, checkpoint in verifiers.items():
        if int(checkpoint.meta["d"]) != records.d:
            raise ValueError(
                f"{name} was trained on d={checkpoint.meta['d']} hidden states; the records of "
                f"{records.records_dir} have d={records.d} (another draft or layer)"
            )
        spec = checkpoint.spec
        embedder = make_embedder(cfg, spec, records)
        features = rows_features(records, rows, spec, embedder, arrays)
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
    for name, score in record_scores(cfg).items():
        if missing_columns(score, frame.columns):
            continue  # records harvested before the column: see unscored_notes
        scores[score.name] = record_score_of(score, records, rows, cfg.methods[name])
    scores["draft_q"] = np.asarray(frame["q"].to_numpy(), dtype=np.float64)
    return scores


def record_score_of(
    score: RecordScore, records: RecordSet, rows: np.ndarray, settings: DictConfig
) -> np.ndarray:
    """One record score on `rows`; a rule with `warm_splits` first sees those splits' other
    rows (flagged `warm`), and only the scores of `rows` are returned."""
    frame = records.frame
    warm = np.zeros(0, dtype=np.int64)
    if score.warm_splits:
        split = frame["split"].to_numpy()
        warm = np.setdiff1d(np.flatnonzero(np.isin(split, score.warm_splits)), rows)
    every = np.concatenate([warm, np.asarray(rows, dtype=np.int64)])
    wanted = [*score.columns, *(c for c in score.optional if c in frame.columns)]
    columns = {column: frame[column].to_numpy()[every] for column in wanted}
    if score.warm_splits:
        columns["warm"] = np.arange(len(every)) < len(warm)
    return np.asarray(score.score(columns, settings))[len(warm) :]


def record_scores(cfg: DictConfig) -> dict[str, RecordScore]:
    """The configured methods whose rule scores records, by method name."""
    return {
        name: traits.record_score
        for name, traits in all_traits(cfg.methods).items()
        if traits.record_score is not None
    }


def missing_columns(score: RecordScore, present: Iterable[str]) -> list[str]:
    """The record columns a record score reads that the records lack."""
    have = set(present)
    return [c for c in score.columns if c not in have]


def unscored_notes(cfg: DictConfig, present: Iterable[str]) -> list[str]:
    """A note per record score left out because the records lack a column it reads."""
    have = list(present)
    return [
        f"{score.name} ({name}) was not scored: the records have no column "
        f"{', '.join(missing_columns(score, have))} (harvested before it was recorded)"
        for name, score in record_scores(cfg).items()
        if missing_columns(score, have)
    ]


def predictor_descriptions(
    cfg: DictConfig, verifiers: dict[str, VerifierCheckpoint]
) -> dict[str, str]:
    """One line per predictor for the report: what its score is, and for the entropy rules
    which H(q) (the records hold only the warped draft's; the bench's rules may read the raw)."""
    return {
        **{n: verifier_description(c) for n, c in verifiers.items()},
        "sv_table": "SV P(accept | S, A), default binning of tables/sv_table.json",
        **{s.name: s.describe(cfg.methods[n]) for n, s in record_scores(cfg).items()},
        "draft_q": "q(x), the draft's probability of its token",
    }


def verifier_description(checkpoint: VerifierCheckpoint) -> str:
    """What a verifier was trained on: the label q/p <= λ, or the soft label min(1, p/q)."""
    head = "" if checkpoint.head == "linear" else f", {checkpoint.head} head (train.head)"
    if checkpoint.label == "accept_prob":
        return f"SPRINTER verifier trained on the soft label min(1, p/q) (SpecDec++'s target){head}"
    return f"SPRINTER verifier trained at λ={checkpoint.lam:g}{head}"
