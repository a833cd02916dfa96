"""Whether a verifier fits the models and sampling it is about to run with, and was not fitted
on the prompts it is about to score: the one rule every reader (stage=evaluate, its
evaluate.transfer, the bench, export) applies through `check_fitted_verifier` (its scores are
of features of one draft, under one sampling; stage=evaluate once scored a verifier on its own
training prompts with exit 0)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sprinter_train.data.overlap import Reader, reader_overlap
from sprinter_train.models.identity import identity_differences
from sprinter_train.verifier.checkpoint import VerifierCheckpoint, train_command

log = logging.getLogger(__name__)


class VerifierMismatchError(ValueError):
    """A verifier trained for another draft or sampling than the run's."""


def draft_differences(meta: Mapping[str, Any], draft: Mapping[str, Any]) -> list[str]:
    """The draft identity fields where the sidecar differs from `draft` (a model_identity).
    A sidecar from before `draft_identity` is compared by its `draft_model` id only: its
    `draft_model_files` was a size-and-mtime signature, which no content digest can match."""
    if meta.get("draft_identity") is not None:
        return [f"draft {d}" for d in identity_differences(meta["draft_identity"], draft)]
    if meta.get("draft_model") is None:
        return []
    log.warning(
        "verifier sidecar without draft_identity: only its draft_model id is compared (retrain "
        "it to have its draft's files, seed and revision checked)"
    )
    if meta["draft_model"] != draft.get("id"):
        return [f"draft_model {meta['draft_model']!r} (now {draft.get('id')!r})"]
    return []


def check_verifier_fits(
    meta: Mapping[str, Any],
    path: Path,
    draft: Mapping[str, Any] | None,
    sampling: Mapping[str, Any],
    experiment: str | None,
) -> None:
    """Refuse a verifier whose sidecar names another draft (any identity field: id, files'
    content, revision, commit, tiny config and seed, vocabulary) or sampling than the run's,
    naming each differing field and the commands that retrain it."""
    problems = draft_differences(meta, draft) if draft else []
    if meta.get("sampling") is not None and dict(meta["sampling"]) != dict(sampling):
        problems.append(f"sampling {meta['sampling']} (now {dict(sampling)})")
    if problems:
        exp = f" experiment={experiment}" if experiment else ""
        raise VerifierMismatchError(
            f"{path} was trained with {'; '.join(problems)}: run with the models and sampling "
            f"it was trained with, or retrain it for these with `python -m sprinter_train "
            f"stage=harvest{exp}` then {train_command(path, experiment)}"
        )


def check_fitted_verifier(
    checkpoint: VerifierCheckpoint,
    reader: Reader,
    draft: Mapping[str, Any] | None,
    sampling: Mapping[str, Any],
    remedy: str,
    hidden_layer: int | None = None,
) -> int | None:
    """Refuse a verifier of another draft or sampling (or, given `hidden_layer`, another
    draft layer) than the reader's, or fitted on prompts the reader scores unless allowed;
    return how many of them it was fitted on (None: unknown, or the reader scores none)."""
    meta, path = checkpoint.meta, checkpoint.path
    if hidden_layer is not None and meta.get("hidden_layer", -1) != hidden_layer:
        raise VerifierMismatchError(
            f"{reader.who}: {path} reads draft hidden layer {meta.get('hidden_layer', -1)}, the "
            f"records hold layer {hidden_layer}: {remedy}"
        )
    check_verifier_fits(meta, path, draft, sampling, reader.experiment)
    return reader_overlap(meta.get("fitted_prompts"), reader, f"the verifier {path}", remedy)
