"""Whether a reader's prompts are ones a predictor was fitted on: a verifier or SV table scored
on its own train prompts reports a speed or an AUC nobody would see on new ones.

A predictor's file stores `fitted_prompts`: the sha256 (16 hex) of every prompt id of the
splits it was trained, calibrated or fitted on, so the check is exact whatever data seed,
fractions or prompt count chose them."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

FIT_SPLITS = ("train", "val")  # a verifier fits on train and calibrates on val


class TrainOverlapError(ValueError):
    """The bench's prompts include prompts its predictors were fitted on."""


def prompt_digest(prompt_id: str) -> str:
    return hashlib.sha256(str(prompt_id).encode()).hexdigest()[:16]


def fitted_prompts(prompt_ids: Iterable[str], splits: Iterable[str]) -> dict[str, Any]:
    """What a predictor's file records of the prompts it was fitted on (sorted digests)."""
    return {
        "splits": list(splits),
        "id_sha256": sorted({prompt_digest(p) for p in prompt_ids}),
    }


def overlapping(recorded: Mapping[str, Any] | None, prompt_ids: Iterable[str]) -> int | None:
    """How many of `prompt_ids` the predictor was fitted on; None when its file records no
    `fitted_prompts` (written before they were stored: it cannot be checked)."""
    if not recorded or not isinstance(recorded.get("id_sha256"), list):
        return None
    fitted = set(recorded["id_sha256"])
    return sum(prompt_digest(p) in fitted for p in set(prompt_ids))


def check_overlap(
    recorded: Mapping[str, Any] | None,
    prompt_ids: list[str],
    what: str,
    allow: bool,
    remedy: str,
    who: str = "the bench",
    key: str = "bench.allow_train_overlap",
) -> int | None:
    """The overlap count (None: unrecorded), or TrainOverlapError when there is one and
    `allow` (`key`: bench.allow_train_overlap, evaluate.allow_train_overlap) is false."""
    count = overlapping(recorded, prompt_ids)
    if count and not allow:
        splits = "/".join((recorded or {}).get("splits") or FIT_SPLITS)
        raise TrainOverlapError(
            f"{count} of {who}'s {len(set(prompt_ids))} prompts are in the {splits} prompts "
            f"{what} was fitted on: {remedy}; or set {key}=true to run anyway (the results "
            "then say how many)"
        )
    return count


@dataclass(frozen=True)
class Reader:
    """Who reads a fitted artifact (a verifier, an SV table) and on what: the one rule every
    reader applies (verifier.fit_check.check_fitted_verifier, sv.table.check_fitted_table)
    takes it. `prompt_ids`: the prompts it scores or times (None: none, as export); `allow`:
    the value of its overlap switch `key`; `experiment`: for the commands errors name."""

    who: str  # "the bench", "stage=evaluate", "evaluate.transfer=<exp>", "stage=export"
    prompt_ids: list[str] | None
    allow: bool
    key: str
    experiment: str | None


def reader_overlap(recorded: Any, reader: Reader, what: str, remedy: str) -> int | None:
    """check_overlap for `reader`: None when it scores no prompts; a count it logs."""
    if reader.prompt_ids is None:
        return None
    count = check_overlap(
        recorded, reader.prompt_ids, what, reader.allow, remedy, who=reader.who, key=reader.key
    )
    if count:
        log.warning("%s: %d of its prompts are ones %s was fitted on", reader.who, count, what)
    return count
