"""One module per family of engine methods; `base` holds what they share.

A method is a class here (a `Method` with its `Traits`) and a conf/methods/<name>.yaml whose
`_target_` names it; decoding/policies/registry.py reads the traits for the rest of the system.
"""

from sprinter_train.decoding.policies.base import (
    AcceptanceTable,
    Method,
    Traits,
    Verifier,
    companion_features,
    draft_round,
    gamma_round,
    overlap,
    step_features,
    verify,
)
from sprinter_train.decoding.policies.entropy import SVIP, AdaEDL
from sprinter_train.decoding.policies.learned import LearnedLength, scores_before_the_draw
from sprinter_train.decoding.policies.mtad import MTAD
from sprinter_train.decoding.policies.speculative import (
    HeuristicSD,
    SpeculativeDecoding,
    TargetOnly,
)
from sprinter_train.decoding.policies.sprinter import Sprinter
from sprinter_train.decoding.policies.sv import SpecVerification, SpecVerificationPaper
from sprinter_train.decoding.policies.typical import TypicalAcceptance

__all__ = [
    "MTAD",
    "SVIP",
    "AcceptanceTable",
    "AdaEDL",
    "HeuristicSD",
    "LearnedLength",
    "Method",
    "SpecVerification",
    "SpecVerificationPaper",
    "SpeculativeDecoding",
    "Sprinter",
    "TargetOnly",
    "Traits",
    "TypicalAcceptance",
    "Verifier",
    "companion_features",
    "draft_round",
    "gamma_round",
    "overlap",
    "scores_before_the_draw",
    "step_features",
    "verify",
]
