"""The built-in verifier features (the entries of feature_table.FEATURES, in the record
schema's and the vector's order) and the recipes they share between records and decoding."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from sprinter_train.core.distributions import entropy, raw_entropy, top2_margin
from sprinter_train.decoding.features.types import (
    Array,
    Column,
    DecodeInputs,
    Feature,
    RecordInputs,
    SequenceHistory,
    Settings,
    Tensor,
)


def smoothed_acceptance(accepted: Tensor, drafts: Tensor, prior: float, n0: float) -> Tensor:
    """(accepted + n0 * prior) / (drafts + n0): a row's acceptance so far, pulled toward
    `prior` while it has few drafts (a Beta(n0 * prior, n0 * (1 - prior)) prior's mean).

    Decoding and training estimate the same quantity, the row's mean acceptance of its
    earlier drafts, from different counts: the decoder counts the drafts it proposed in
    earlier rounds and those kept as drawn (accepted by the target's check or trusted by a
    verifier), so drafts of the current round are not in it yet; records count every earlier
    recorded position of the sequence (each one a draft x ~ q) with its expected acceptance
    min(1, p/q) in place of a 0/1 outcome."""
    return (accepted.float() + n0 * prior) / (drafts.float() + n0)


def clipped_run(run: Tensor, cap: int) -> Tensor:
    """The run position as the verifier sees it, float32 in [0, cap]: records and decoding
    clip at the same sidecar value, so neither meets a range the other never had."""
    return run.clamp(min=0, max=cap).float()


def _array(name: str) -> Callable[[RecordInputs, Settings], Tensor]:
    """The feature's own recorded array (its `Array`), as the records store it."""
    return lambda records, settings: records.array(name)


def _embedded(records: RecordInputs, settings: Settings) -> Tensor:
    if records.embedder is None:
        raise ValueError("the token_embedding feature needs the draft model's embedding")
    emb = records.embedder(np.asarray(records.columns["token_id"], dtype=np.int64))
    return torch.from_numpy(np.ascontiguousarray(emb, dtype=np.float32))


def _column(name: str) -> Callable[[RecordInputs, Settings], Tensor]:
    return lambda records, settings: records.column(name)


def _drafted_q(inputs: DecodeInputs, settings: Settings) -> Tensor:
    """q(x) read on the draft's head (its K tokens; q is 0 off them), so a step is not spread
    over the vocabulary to read one value a row."""
    q, x = inputs.step.on_space_of(inputs.step.head_q)
    return q.gather(1, x[:, None])[:, 0].float()


def _accepted_before(history: SequenceHistory) -> np.ndarray:
    """The sum of accept_prob over the sequence's earlier records (float64 sums)."""
    earlier = np.concatenate([[0.0], np.cumsum(history.accept_prob, dtype=np.float64)[:-1]])
    return earlier.astype(np.float32)


def builtin_features() -> tuple[Feature, ...]:
    """The built-in features, in the record schema's and the vector's order."""
    features: list[Feature] = []
    features.append(
        Feature(
            "hidden",
            "the draft's hidden state that produced q (the record's `hidden` array at t - 1)",
            from_records=_array("hidden"),
            at_decode=lambda inputs, settings: inputs.step.hidden,
            reads=(),
            array=Array(
                "the draft's hidden width",
                width_of=lambda models: int(models.draft.model.config.hidden_size),
                at_position=lambda at: at.draft_hidden,
                about=lambda settings: {"layer": settings["hidden_layer"]},
            ),
            pre_draw=True,
        )
    )
    features.append(
        Feature(
            "token_embedding",
            "the draft's input embedding of the drafted token x",
            from_records=_embedded,
            at_decode=lambda inputs, settings: inputs.embedding(inputs.step.tokens),
            reads=("token_id",),
            width="embedding",
        )
    )
    features.append(
        Feature(
            "target_hidden",
            "the target's final hidden state at the row's last target-verified position: for a"
            " draft at t with run position r, the target's state at t - r - 2 (decoding/"
            "state.py's RowState says why; zero where the target verified nothing of the row)",
            from_records=_array("target_hidden"),
            at_decode=lambda inputs, settings: inputs.row.target_hidden,
            reads=(),
            array=Array(
                "the target's hidden width",
                width_of=lambda models: int(models.target.model.config.hidden_size),
                at_position=lambda at: at.target_final,
                at_last_verified=True,
                note="the target's final state",
            ),
            row_fields=("target_hidden",),
        )
    )
    features.append(
        Feature(
            "q",
            "q(x), the drafted token's warped draft probability (the record's `q`)",
            from_records=_column("q"),
            at_decode=_drafted_q,
            reads=("q",),
        )
    )
    features.append(
        Feature(
            "draft_entropy",
            "H(q) of the warped draft distribution, nats (the record's `draft_entropy`)",
            from_records=_column("draft_entropy"),
            at_decode=lambda inputs, settings: entropy(
                inputs.step.head_q.float()
            ),  # 0 off the head
            reads=("draft_entropy",),
            pre_draw=True,
        )
    )
    features.append(
        Feature(
            "draft_margin",
            "the draft's raw logit top-1 minus top-2 at the position (vLLM's online acceptance"
            " estimator)",
            from_records=_column("draft_margin"),
            at_decode=lambda inputs, settings: top2_margin(inputs.step.head_logits),
            columns=(
                Column(
                    "draft_margin",
                    "raw draft logits at t: top-1 minus top-2",
                    low=0.0,
                    at_position=lambda at: top2_margin(at.draft_logits),
                ),
            ),
        )
    )
    features.append(
        Feature(
            "draft_entropy_raw",
            "H(softmax(raw draft logits)), nats, whatever sampling warps q with",
            from_records=_column("draft_entropy_raw"),
            at_decode=lambda inputs, settings: raw_entropy(inputs.step.head_logits),
            columns=(
                Column(
                    "draft_entropy_raw",
                    "H(softmax(raw draft logits at t)), nats",
                    low=0.0,
                    at_position=lambda at: raw_entropy(at.draft_logits),
                ),
            ),
        )
    )
    features.append(
        Feature(
            "run_position",
            "how many draft-made tokens stand right before the position (at decode: the row's"
            " run at the round's start plus the draft's index in the round), clipped at the"
            " sidecar's `run_position_cap`",
            from_records=lambda records, settings: clipped_run(
                records.column("run_position"), int(settings["run_position_cap"])
            ),
            at_decode=lambda inputs, settings: clipped_run(
                inputs.row.run + inputs.step.index, int(settings["run_position_cap"])
            ),
            columns=(
                Column(
                    "run_position",
                    "consecutive draft-made tokens right before t",
                    dtype="int32",
                    low=0.0,
                    per_sequence=lambda history: history.runs,
                ),
            ),
            settings=("run_position_cap",),
            row_fields=("run",),
        )
    )
    features.append(
        Feature(
            "accept_so_far",
            "the row's acceptance so far, Beta-smoothed (`smoothed_acceptance`)",
            from_records=lambda records, settings: smoothed_acceptance(
                records.column("accepted_before"),
                records.column("drafts_before"),
                settings["accept_prior"],
                settings["accept_n0"],
            ),
            at_decode=lambda inputs, settings: smoothed_acceptance(
                inputs.row.accepted,
                inputs.row.drafted,
                settings["accept_prior"],
                settings["accept_n0"],
            ),
            columns=(
                Column(
                    "accepted_before",
                    "sum of accept_prob over this sequence's earlier records",
                    low=0.0,
                    per_sequence=_accepted_before,
                ),
                Column(
                    "drafts_before",
                    "how many earlier records this sequence has",
                    dtype="int32",
                    low=0.0,
                    per_sequence=lambda history: np.arange(len(history.runs), dtype=np.int32),
                ),
            ),
            settings=("accept_prior", "accept_n0"),
            row_fields=("accepted", "drafted"),
        )
    )
    features.append(
        Feature(
            "target_margin",
            "the target's raw top-2 logit margin at the row's last target-verified position"
            " (as target_hidden's)",
            from_records=_column("target_margin"),
            at_decode=lambda inputs, settings: inputs.row.target_margin,
            columns=(
                Column(
                    "target_margin",
                    "raw target top-1 - top-2 at t - run_position - 2",
                    low=0.0,
                    at_position=lambda at: top2_margin(at.target_logits),
                    at_last_verified=True,
                ),
            ),
            row_fields=("target_margin",),
        )
    )
    return tuple(features)
