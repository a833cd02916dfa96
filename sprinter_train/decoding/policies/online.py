"""The online logistic (vLLM-style) as a verifier a length policy reads, and sd_online.

`OnlineVerifier` scores each draft with decoding/policies/plans/online_logistic.py's per-position logistic
on the draft's top-2 margin (of the raw logits the draft step offers, else of its warped q;
`margin` chooses) and learns from the verify outcomes the policy hands back in `update`.
The margin is fixed before the draw, so sd_learned may use it to decide whether to draw.
`sd_learned` and `sprinter` take it through their `verifier` entry (`kind: online`, the bench
builds it instead of loading a checkpoint); `sd_online` is sd_learned with it built in, and
its traits carry the record score that stage=evaluate runs over the records in sequence
order (the same updates, on the `draft_margin` column).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from sprinter_train.decoding.batch import Batch, DraftStep, Round, Row
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies.base import RecordScore, Traits
from sprinter_train.decoding.policies.learned import LearnedLength
from sprinter_train.decoding.policies.plans.online_logistic import OnlineLogistic, top2_margin

MARGINS = ("logits", "q")


class OnlineVerifier:
    """Callable as policies.Verifier; `observe` (called from the policy's `update`) folds a
    row's verify outcome into the estimator."""

    pre_draw = True  # the margin of q_j is known before x_j is drawn

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.margin_of = str(settings.get("margin", "logits"))
        if self.margin_of not in MARGINS:
            raise ValueError(f"online verifier: margin must be one of {MARGINS}")
        self.estimator = OnlineLogistic.from_settings(settings)
        self.warmup_score = float(settings["warmup_score"])
        self.prior = float(torch.sigmoid(torch.tensor(float(settings["init_bias"]))))
        # row id -> [(position, margins (B,), predictions (B,), scores (B,), the row's index)]
        self.pending: dict[
            int, list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, int]]
        ] = {}

    def margin(self, step: DraftStep) -> torch.Tensor:
        """(B,) top-1 minus top-2 of the raw logits where offered and asked for, else of q."""
        if self.margin_of == "logits" and step.head_logits is not None:
            return top2_margin(step.head_logits)
        return top2_margin(step.head_q)

    @torch.inference_mode()
    def __call__(self, engine: Engine, batch: Batch, rnd: Round, step: DraftStep) -> torch.Tensor:
        """(B,) the estimator's P(accept) (its warm-up score until it is warm)."""
        start = time.perf_counter()
        position = len(rnd.steps) - 1 if rnd.steps and rnd.steps[-1] is step else len(rnd.steps)
        margin = self.margin(step)
        pred = self.estimator.predict(margin, position)
        score = pred if self.estimator.warm else torch.full_like(pred, self.warmup_score)
        for r, row in enumerate(batch.rows):
            entries = self.pending.setdefault(id(row), [])
            entries[:] = [e for e in entries if e[0] != position]  # keep() then stop() rescore
            entries.append((position, margin, pred, score, r))
        batch.stats.verifier_seconds += time.perf_counter() - start
        return score

    def observe(self, row: Row, drafted: int, accepted: int, tau: float | None = None) -> None:
        """A row's round outcome: positions < accepted were accepted, position `accepted`
        (if drafted) rejected, later ones never examined (vLLM's observation rule). With
        `tau` (SPRINTER), only the row's last draft counts, and only where its score was
        below tau: the one token the target checked."""
        entries = self.pending.pop(id(row), [])
        kept = []
        for position, margin, pred, score, r in entries:
            if tau is not None:
                if position == drafted - 1 and float(score[r]) < tau:
                    kept.append((position, margin[r], pred[r], float(accepted > 0)))
            elif position <= accepted and position < drafted:
                kept.append((position, margin[r], pred[r], float(position < accepted)))
        if not kept:
            return
        positions = torch.tensor([k[0] for k in kept])
        margins = torch.stack([k[1] for k in kept]).cpu()
        preds = torch.stack([k[2] for k in kept]).cpu()
        labels = torch.tensor([k[3] for k in kept], dtype=torch.float64)
        self.estimator.observe(margins, positions, preds, labels)

    def record(self) -> dict[str, Any]:
        return {"kind": "online", "margin": self.margin_of, **self.estimator.state()}


def online_records(columns: Mapping[str, np.ndarray], settings: Mapping[str, Any]) -> np.ndarray:
    """The online logistic run over the records in sequence order (prompt, then position),
    each record scored before its own outcome is folded in; the outcome is the record's
    min(1, p/q), the verify step's expected accept (no sampling noise). Records carry a
    draft position in `run_position` where harvested with it; else one shared logistic.

    Rows flagged in a `warm` column (the fit splits' records) go first: a decoder's
    estimator has seen many verify outcomes before the rows it is judged on. Without them a
    test split of a few hundred rows reaches at most one refit, and a draft position that
    gets fewer than `min_observations` of a round keeps its initial slope 0: every row
    there scores the same (the draft mix's long runs all share the last position)."""
    online = settings["online"]
    estimator = OnlineLogistic.from_settings(online)
    margin = np.asarray(columns["draft_margin"], dtype=np.float64)
    label = np.asarray(columns["accept_prob"], dtype=np.float64)
    run = columns.get("run_position")
    position = np.zeros(len(margin), np.int64) if run is None else np.asarray(run, np.int64)
    warm = np.asarray(columns.get("warm", np.zeros(len(margin), bool)), dtype=bool)
    order = np.lexsort((np.asarray(columns["position"]), np.asarray(columns["prompt_id"]), ~warm))
    scores = np.zeros(len(margin))
    start = 0
    while start < len(order):  # the coefficients change only at a refit: score a block at once
        stop = min(len(order), start + int(estimator.refit_interval) - estimator.seen)
        rows = order[start:stop]
        m, k = torch.from_numpy(margin[rows]), torch.from_numpy(position[rows])
        pred = estimator.predict(m, k)
        scores[rows] = pred.numpy()
        estimator.observe(m, k, pred, torch.from_numpy(label[rows]))
        start = stop
    return scores


def online_text(settings: Mapping[str, Any]) -> str:
    online = settings["online"]
    return (
        "online per-position logistic on the draft's top-2 logit margin (vLLM-style Newton "
        f"refits every {online['refit_interval']} observations, l2 {online['l2']}), run over "
        "the train and val records, then the scored ones, in sequence order with min(1, p/q) "
        "as each outcome"
    )


@dataclass
class OnlineLength(LearnedLength):
    """sd_online: sd_learned whose verifier is the online logistic, learnt while decoding
    (no training stage, no table): every drawn draft is verified, so it stays lossless."""

    traits: ClassVar[Traits] = Traits(
        lossless=True,
        greedy_exact=True,
        needs=frozenset({"latency"}),
        law_computed=True,
        exports=False,
        rivals=("sd", "sd_learned", "svip"),
        record_score=RecordScore(
            "online_margin",
            ("draft_margin", "accept_prob", "prompt_id", "position"),
            online_records,
            online_text,
            optional=("run_position",),
            warm_splits=("train", "val"),
        ),
    )

    verifier: Any = None
    table: Any = None
    max_gamma: int = 0
    online: Mapping[str, Any] = field(default_factory=dict)
    name: str = "sd_online"

    def __post_init__(self) -> None:
        if self.verifier is None:
            self.verifier = OnlineVerifier(self.online)
