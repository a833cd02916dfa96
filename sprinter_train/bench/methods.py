"""The bench's methods built from `conf/bench`: engine policies, or a reason one cannot run.

A method whose artifact is missing (no verifier for sprinter, no SV table or companion for sv)
is skipped with the command that makes the artifact, so a bench without a harvest still
measures everything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sprinter_train.bench.latency import LatencyProfile
from sprinter_train.decoding.policies import (
    MTAD,
    SVIP,
    AdaEDL,
    HeuristicSD,
    Policy,
    SpeculativeDecoding,
    SpecVerification,
    Sprinter,
    TargetOnly,
)
from sprinter_train.sv.table import SVTable
from sprinter_train.verifier.checkpoint import load_verifier, verifier_path
from sprinter_train.verifier.scorer import CheckpointVerifier

PEERS = {"hf_assisted": "constant", "hf_assisted_heuristic": "heuristic"}
ENGINE_METHODS = ("target_only", "sd", "sd_heuristic", "svip", "adaedl", "sprinter", "sv", "mtad")


@dataclass
class MethodPlan:
    """What to run per method: an engine policy, or HF's peer with its settings."""

    policies: dict[str, Policy]
    peers: dict[str, dict[str, Any]]
    skipped: dict[str, str]
    settings: dict[str, dict[str, Any]]


def plan_methods(
    cfg: DictConfig, profile: LatencyProfile, sd_gamma: int, draft_model, has_companion: bool
) -> MethodPlan:
    b = cfg.bench
    unknown = sorted(set(b.methods) - set(ENGINE_METHODS) - set(PEERS))
    if unknown:
        raise ValueError(
            f"unknown bench.methods {unknown}; choose from {', '.join(ENGINE_METHODS + tuple(PEERS))}"
        )
    plan = MethodPlan({}, {}, {}, {})
    for name in b.methods:
        try:
            if name in PEERS:
                tokens = b[name].num_assistant_tokens
                n = sd_gamma if tokens == "auto" else int(tokens)
                plan.peers[name] = {"schedule": PEERS[name], "num_assistant_tokens": n}
                plan.settings[name] = dict(plan.peers[name])
            else:
                plan.policies[name], plan.settings[name] = _policy(
                    name, cfg, profile, sd_gamma, draft_model, has_companion
                )
        except FileNotFoundError as err:
            plan.skipped[name] = str(err)
    return plan


def _policy(
    name: str, cfg: DictConfig, profile: LatencyProfile, sd_gamma: int, draft_model, companion: bool
) -> tuple[Policy, dict[str, Any]]:
    b = cfg.bench
    if name == "target_only":
        return TargetOnly(), {}
    if name == "sd":
        return SpeculativeDecoding(sd_gamma), {"gamma": sd_gamma}
    if name == "sd_heuristic":
        s = b.sd_heuristic
        return HeuristicSD(int(s.gamma_init), int(s.gamma_min)), dict(s)
    if name == "svip":
        s = b.svip
        return SVIP(float(s.h), int(s.max_gamma), float(s.c), bool(s.warped_entropy)), dict(s)
    if name == "adaedl":
        s = b.adaedl
        return AdaEDL(float(s.gamma), float(s.lam), int(s.max_gamma), bool(s.warped_entropy)), dict(
            s
        )
    if name == "mtad":
        s = b.mtad
        return MTAD(int(s.gamma), int(s.beam_width), float(s.tau)), dict(s)
    if name == "sprinter":
        s = b.sprinter
        path = verifier_path(cfg.checkpoint_dir, float(s.lam))
        checkpoint = load_verifier(path, cfg.experiment)
        verifier = CheckpointVerifier(checkpoint, draft_model)
        return Sprinter(verifier, float(s.tau), int(s.max_run)), {**dict(s), "verifier": str(path)}
    if name == "sv":
        s = b.sv
        if not companion:
            raise FileNotFoundError("sv needs a companion model (models.companion)")
        path = Path(cfg.experiment_dir) / "tables" / "sv_table.json"
        table = SVTable.load(path, s.binning)  # a missing table names stage=tables
        policy = SpecVerification(
            lambda S, A: float(table.lookup(S, A)), profile.sv_round_s, int(s.max_gamma)
        )
        return policy, {**dict(s), "table": str(path)}
    raise ValueError(name)
