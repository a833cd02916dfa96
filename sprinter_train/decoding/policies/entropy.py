"""The entropy rules: SVIP and AdaEDL stop drafting where the draft is unsure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from sprinter_train.core.rules import adaedl_score, adaedl_should_stop, svip_score, svip_should_stop
from sprinter_train.decoding.batch import Batch, DraftStep, Emitted
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies.base import Method, RecordScore, Traits, draft_round, verify

ENTROPY_COLUMNS = ("draft_entropy", "draft_entropy_raw")  # warped H(q), raw softmax H


def records_entropy(columns: Mapping[str, np.ndarray], settings: Mapping[str, Any]) -> np.ndarray:
    """The records' H_q that the bench's rule reads: of the draft's raw softmax
    (`draft_entropy_raw`, the default) or of the warped q (`warped_entropy: true`)."""
    column = ENTROPY_COLUMNS[0] if settings.get("warped_entropy", False) else ENTROPY_COLUMNS[1]
    return np.asarray(columns[column], dtype=np.float64)


def entropy_note(settings: Mapping[str, Any]) -> str:
    """Which H_q a record score used: the one the bench's rule reads. The scores are not
    clipped (they can be negative at high entropy): clipping at 0 would tie every such record
    and flatten the ROC."""
    if settings.get("warped_entropy", False):
        return ", H_q = the records' draft_entropy (of the warped q), as the bench's rule"
    return (
        ", H_q = the records' draft_entropy_raw (of the draft's raw softmax), as the bench's rule"
    )


def svip_records(columns: Mapping[str, np.ndarray], settings: Mapping[str, Any]) -> np.ndarray:
    """SVIP's 1 - sqrt(c H_q): the svip policy stops when this falls below 1 - h."""
    return svip_score(records_entropy(columns, settings), float(settings["c"]))


def svip_text(settings: Mapping[str, Any]) -> str:
    return f"SVIP 1 - sqrt({settings['c']} H_q)" + entropy_note(settings)


def adaedl_records(columns: Mapping[str, np.ndarray], settings: Mapping[str, Any]) -> np.ndarray:
    """AdaEDL's 1 - sqrt(gamma H_q), the bound the adaedl policy stops on."""
    return adaedl_score(records_entropy(columns, settings), float(settings["gamma"]))


def adaedl_text(settings: Mapping[str, Any]) -> str:
    return f"AdaEDL 1 - sqrt({settings['gamma']} H_q)" + entropy_note(settings)


@dataclass
class SVIP(Method):
    """SVIP Alg. 1: draft until sqrt(c H_q) > h (the token that tripped it is kept)."""

    # every trait spelt out (Traits has no defaults): the blocks look alike on purpose
    traits: ClassVar[Traits] = Traits(
        lossless=True,
        greedy_exact=True,
        needs=frozenset(),
        law_computed=False,
        exports=True,
        rivals=("sd",),
        record_score=RecordScore("svip_entropy", ENTROPY_COLUMNS, svip_records, svip_text),
    )

    h: float
    max_gamma: int
    c: float
    warped_entropy: bool = False
    name: str = "svip"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        def stop(step: DraftStep) -> torch.Tensor:
            return svip_should_stop(step.entropy(self.warped_entropy), self.h, self.c)

        return verify(engine, batch, draft_round(engine, batch, batch.room(self.max_gamma), stop))


@dataclass
class AdaEDL(Method):
    """AdaEDL: stop before a token whose entropy bound 1 - sqrt(gamma H_q) falls below lambda
    (decided from q_j before the draw; a row's first draft is always drawn).

    gamma is the bound's constant (the paper's name), not a number of drafts. The threshold is
    fixed (the paper's adaptive-lambda refinement is not implemented).
    """

    # every trait spelt out (Traits has no defaults): the blocks look alike on purpose
    traits: ClassVar[Traits] = Traits(
        lossless=True,
        greedy_exact=True,
        needs=frozenset(),
        law_computed=False,
        exports=False,
        rivals=("sd",),
        record_score=RecordScore("adaedl_bound", ENTROPY_COLUMNS, adaedl_records, adaedl_text),
    )

    gamma: float
    lam: float
    max_gamma: int
    warped_entropy: bool = False
    name: str = "adaedl"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        def keep(j: int, step: DraftStep) -> torch.Tensor:
            if j == 0:
                return torch.ones_like(step.active)
            return ~adaedl_should_stop(step.entropy(self.warped_entropy), self.gamma, self.lam)

        return verify(
            engine, batch, draft_round(engine, batch, batch.room(self.max_gamma), keep=keep)
        )
