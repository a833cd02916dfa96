"""The one rule every reader of a fitted artifact (a verifier, an SV table) applies: it was
fitted for these models and sampling, and none of the prompts the reader scores or times is
one it was fitted on.

stage=evaluate, evaluate.transfer, stage=bench and stage=export each read verifiers and
tables; each used to check its own subset (evaluate none: it scored a verifier on its own
training prompts with exit 0, noting only that it was "trained on another record set").
Every reader now calls `check_verifier` / `check_table` with a `Reader` saying who it is,
which prompts it scores (None: it scores none, as export) and which key allows an overlap.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sprinter_train.data.overlap import check_overlap

if TYPE_CHECKING:
    from sprinter_train.sv.table import SVTable
    from sprinter_train.verifier.checkpoint import VerifierCheckpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reader:
    """Who reads fitted artifacts and on what: `prompt_ids` it scores (None: none), `allow`
    the value of its overlap switch `key`, `experiment` for the commands the errors name."""

    who: str  # "the bench", "stage=evaluate", "evaluate.transfer=<exp>", "stage=export"
    prompt_ids: list[str] | None
    allow: bool
    key: str
    experiment: str | None


def check_verifier(
    checkpoint: VerifierCheckpoint,
    reader: Reader,
    draft: Mapping[str, Any] | None,
    sampling: Mapping[str, Any],
    remedy: str,
    hidden_layer: int | None = None,
) -> int | None:
    """Refuse a verifier of another draft or sampling (or, given `hidden_layer`, another
    draft layer) than the reader's, or fitted on prompts the reader scores unless allowed;
    return how many of them it was fitted on (None: unknown or no prompts)."""
    from sprinter_train.verifier.fit_check import VerifierMismatchError, check_verifier_fits

    meta, path = checkpoint.meta, checkpoint.path
    if hidden_layer is not None and meta.get("hidden_layer", -1) != hidden_layer:
        raise VerifierMismatchError(
            f"{reader.who}: {path} reads draft hidden layer {meta.get('hidden_layer', -1)}, the "
            f"records hold layer {hidden_layer}: {remedy}"
        )
    check_verifier_fits(meta, path, draft, sampling, reader.experiment)
    return _overlap(meta.get("fitted_prompts"), reader, f"the verifier {path}", remedy)


def check_table(
    table: SVTable,
    path: Path,
    reader: Reader,
    identities: dict[str, dict[str, Any]] | None,
    remedy: str,
) -> int | None:
    """Refuse an SV table fitted on records of other models than `identities` (role ->
    model_identity; None: not known here), or on prompts the reader scores unless allowed;
    return how many of them it was fitted on."""
    from sprinter_train.sv.table import check_table_models

    if identities is not None:
        check_table_models(table, path, identities, str(reader.experiment))
    return _overlap(table.meta.get("fitted_prompts"), reader, f"the SV table {path}", remedy)


def _overlap(recorded: Any, reader: Reader, what: str, remedy: str) -> int | None:
    if reader.prompt_ids is None:
        return None
    count = check_overlap(
        recorded, reader.prompt_ids, what, reader.allow, remedy, who=reader.who, key=reader.key
    )
    if count:
        log.warning("%s: %d of its prompts are ones %s was fitted on", reader.who, count, what)
    return count
