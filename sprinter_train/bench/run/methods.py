"""The bench's methods: engine policies built from `cfg.methods`, HF's and vLLM's peers from
`cfg.bench`.

Each engine method is conf/methods/<name>.yaml, composed into `cfg.methods.<name>`, whose
`_target_` hydra.utils.instantiate calls with the method's parameters. What a config cannot
hold is passed in at run time, keyed by the entry that asks for it (`runtime_entries`), so a
new method needs a yaml, not code here. A method whose artifact is missing (no verifier for
sprinter, no SV table or companion for sv) is skipped with the command that makes the
artifact, so a bench without a harvest still measures everything else.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from sprinter_train.bench.peers import vllm_peer
from sprinter_train.bench.peers.vllm_peer import VLLM_NAMES, PeerUnavailable
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.overlap import Reader
from sprinter_train.decoding.batch import Policy
from sprinter_train.decoding.builder import compiles
from sprinter_train.decoding.policies.entropy_verifier import KIND as ENTROPY_KIND
from sprinter_train.decoding.policies.entropy_verifier import EntropyVerifier
from sprinter_train.decoding.policies.online import OnlineVerifier
from sprinter_train.decoding.policies.plans.companion_plan import CompanionPlan
from sprinter_train.decoding.policies.plans.gamma_plan import GammaPlanner
from sprinter_train.decoding.policies.registry import MethodError, traits_of
from sprinter_train.sv.table import SVTable, check_fitted_table
from sprinter_train.verifier.checkpoint import (
    load_verifier,
    train_command,
    verifier_path,
)
from sprinter_train.verifier.fit_check import VerifierMismatchError, check_fitted_verifier
from sprinter_train.verifier.labels import Label
from sprinter_train.verifier.scorer import CheckpointVerifier

log = logging.getLogger(__name__)

PEERS = {"hf_assisted": "constant", "hf_assisted_heuristic": "heuristic"}  # name -> schedule
HF_STATIC = (
    "hf_static"  # the target alone through HF's static cache + compile (bench/peers/hf_static.py)
)
PEER_NAMES = (*PEERS, HF_STATIC)  # every HF peer: batch 1 only, settings in cfg.bench.<name>
# vLLM's peers (bench/peers/vllm_peer.py): every batch size, settings in cfg.bench.vllm
OUTSIDE = (*PEER_NAMES, *VLLM_NAMES)  # bench methods that are no conf/methods/<name>.yaml


def unknown_methods(methods: Mapping[str, Any], names: Iterable[str]) -> list[str]:
    """The names that are neither a configured method nor a peer, sorted."""
    return sorted({name for name in names if name not in methods and name not in OUTSIDE})


def method_problems(cfg: DictConfig | Mapping[str, Any]) -> list[str]:
    """Bench methods that are neither a conf/methods/<name>.yaml nor an HF peer, or whose
    class declares no traits: found before any model loads (only where the bench runs)."""
    if cfg.get("stage") not in ("bench", "all"):
        return []
    methods, bench = cfg.get("methods") or {}, cfg.get("bench") or {}
    names = list(dict.fromkeys(bench.get("methods") or []))
    known = (*methods, *OUTSIDE)
    problems = [
        f"bench.methods: unknown method {name!r}; choose from {', '.join(known)}"
        for name in unknown_methods(methods, names)
    ]
    for name in names:
        if name in methods and name not in OUTSIDE:
            try:
                traits_of(methods[name], name)
            except MethodError as err:
                problems.append(str(err))
    return problems


def hf_static_settings(cfg: DictConfig, device: torch.device) -> dict[str, Any]:
    """hf_static's settings: compiled where the engine's layout would compile
    (`decoding.builder.compiles`), in `bench.hf_static.compile_mode`."""
    compiled = compiles(cfg.get("decoding", {}), device)
    return {"compile": compiled, "compile_mode": str(cfg.bench[HF_STATIC].compile_mode)}


def vllm_settings(name: str, run: RunInputs) -> dict[str, Any]:
    """A vLLM peer's settings (`bench.vllm`, bench/peers/vllm_peer.py), compiled where the
    engine's layout would compile, as hf_static; vllm_sd_learned's verifier (sd_learned's,
    carried by the export folder the bench stage writes) loaded and checked as sd_learned's
    own. PeerUnavailable (or a missing verifier's FileNotFoundError) skips the method."""
    cfg = run.cfg
    learned = cfg.methods.get("sd_learned") if name == vllm_peer.VLLM_SD_LEARNED else None
    if learned is not None and (is_online(learned.verifier) or is_entropy(learned.verifier)):
        kind = learned.verifier.kind
        raise PeerUnavailable(f"{name} runs a verifier file; methods.sd_learned's is {kind}")
    settings = vllm_peer.plan_settings(
        name,
        OmegaConf.to_container(cfg.bench.get("vllm") or {}, resolve=True),  # type: ignore[arg-type]
        OmegaConf.to_container(cfg.models, resolve=True),  # type: ignore[arg-type]
        run.sd_gamma,
        compiles(cfg.get("decoding", {}), run.device),
    )
    if name == vllm_peer.VLLM_SD_LEARNED:
        if learned is None:
            raise PeerUnavailable(f"{name} exports sd_learned: no conf/methods/sd_learned.yaml")
        settings["verifier"] = _verifier("sd_learned", learned, run)[1]
    return settings


@dataclass
class MethodPlan:
    """What to run per method: an engine policy, or HF's peer with its settings."""

    policies: dict[str, Policy]
    peers: dict[str, dict[str, Any]]
    skipped: dict[str, str]
    settings: dict[str, dict[str, Any]]


@dataclass
class RunInputs:
    """What the bench measured or loaded that a method's config refers to."""

    cfg: DictConfig
    sd_gamma: int  # the gamma maximising the implied speedup, or methods.sd.gamma when set
    draft_model: torch.nn.Module
    has_companion: bool
    device: torch.device
    draft_identity: dict[str, Any] | None = None  # model_identity of the bench's draft
    alpha: float | None = None  # the bench's acceptance estimate (sd's planner starts there)
    identities: dict[str, dict[str, Any]] | None = None  # role -> model_identity, all roles
    prompt_ids: list[str] | None = None  # the bench's prompts: none may be a predictor's fit


def bench_reader(run: RunInputs) -> Reader:
    """The bench as a reader of fitted artifacts (verifier/fit_check.py, sv/table.py): it times its prompts, and
    bench.allow_train_overlap lets it time ones a predictor was fitted on."""
    return Reader(
        "the bench",
        run.prompt_ids,
        bool(run.cfg.bench.get("allow_train_overlap", False)),
        "bench.allow_train_overlap",
        str(run.cfg.experiment),
    )


def verifier_hidden_layer(cfg: DictConfig) -> int:
    """The draft hidden layer the bench's verifiers read (their sidecars' `hidden_layer`; -1,
    the final normed state, without any): the draft's runner must hand them that layer.
    Every verifier the bench will run is read here, its sidecar checked (verifier/sidecar.py),
    so prepare calls it before any model loads."""
    layers = set()
    for name in cfg.bench.methods:
        if name in OUTSIDE or "verifier" not in runtime_entries(cfg.methods[name]):
            continue
        if is_online(cfg.methods[name].verifier) or is_entropy(cfg.methods[name].verifier):
            continue  # reads no hidden state
        path = method_verifier_path(cfg.checkpoint_dir, cfg.methods[name])
        try:
            checkpoint = load_verifier(path, cfg.experiment)
        except FileNotFoundError:
            continue  # plan_methods skips the method, naming stage=train
        layers.add(int(checkpoint.meta.get("hidden_layer", -1)))
    if len(layers) > 1:
        raise VerifierMismatchError(
            f"the bench's verifiers read different draft hidden layers {sorted(layers)}; "
            "bench them in separate runs"
        )
    return layers.pop() if layers else -1


def method_verifier_path(checkpoint_dir: str | Path, node: DictConfig) -> Path:
    """The exported verifier a method's `verifier` entry names: `label: accept_prob` the soft-label
    one, else the ratio one at its `lam`."""
    entry = node.verifier
    head = str(entry.get("head", "linear"))  # mlp: the train.head=mlp verifier
    if entry.get("label", "ratio") == "accept_prob":
        return verifier_path(checkpoint_dir, Label("accept_prob"), head)
    return verifier_path(checkpoint_dir, float(entry.lam), head)


def runtime_entries(node: DictConfig) -> list[str]:
    """The entries of a method's config the bench fills in: `gamma: auto` (sd's chosen gamma),
    `planner` (with `gamma: auto`, sd's gamma chosen again every round from the engine's
    timings and the run's acceptance, with the block's settings), `verifier` (the exported
    verifier it describes), `table` (SV's fitted table; null: none) and `companion_plan` (sv's
    mode chosen every round, with the block's settings). What a forward costs is not a
    method's: every policy reads the engine's timings, which the bench primes with its
    latency profile."""
    keys = list(node.keys())
    wanted = {
        "gamma": "gamma" in keys and node.gamma == "auto",
        "planner": node.get("planner") is not None,
        "verifier": "verifier" in keys,
        "table": "table" in keys and node.table is not None,
        "companion_plan": node.get("companion_plan") is not None,
    }
    return [key for key, needed in wanted.items() if needed]


def _sd_gamma(name: str, node: DictConfig, run: RunInputs) -> tuple[int, int]:
    return run.sd_gamma, run.sd_gamma


def _planner(name: str, node: DictConfig, run: RunInputs) -> tuple[Any, Any]:
    """sd's round-by-round gamma, starting from the bench's alpha (the block's settings).
    None with a fixed gamma (the config's number stands)."""
    if node.get("gamma") != "auto":
        return None, None
    settings = OmegaConf.to_container(node.planner)
    planner = GammaPlanner(run.alpha, int(run.cfg.bench.gamma_max), **settings)  # type: ignore[arg-type]
    return planner, planner.record()


def is_online(entry: Any) -> bool:
    """A `verifier` entry that asks for the online logistic instead of a checkpoint."""
    return hasattr(entry, "get") and entry.get("kind", "checkpoint") == "online"


def is_entropy(entry: Any) -> bool:
    """A `verifier` entry that asks for the draft's raw entropy as the score (a hand rule,
    decoding/policies/entropy_verifier.py) instead of a checkpoint."""
    return hasattr(entry, "get") and entry.get("kind", "checkpoint") == ENTROPY_KIND


def online_settings(cfg: DictConfig, entry: DictConfig) -> dict[str, Any]:
    """methods.sd_online.online's settings (the online logistic's defaults), overridden by the
    entry's own keys."""
    defaults = cfg.methods.get("sd_online", {}).get("online") or {}
    own = {k: v for k, v in OmegaConf.to_container(entry, resolve=True).items() if k != "kind"}  # type: ignore[union-attr]
    return {**OmegaConf.to_container(defaults, resolve=True), **own}  # type: ignore[arg-type]


def _verifier(name: str, node: DictConfig, run: RunInputs) -> tuple[Any, dict[str, Any]]:
    if is_online(node.verifier):
        settings = online_settings(run.cfg, node.verifier)
        return OnlineVerifier(settings), {"kind": "online", **settings}
    if is_entropy(node.verifier):
        scorer = EntropyVerifier()
        return scorer, scorer.record()
    path = method_verifier_path(run.cfg.checkpoint_dir, node)
    checkpoint = load_verifier(path, run.cfg.experiment)  # a missing one names stage=train
    sampling = dataclasses.asdict(SamplingConfig.from_cfg(run.cfg.sampling))
    overlap = check_fitted_verifier(
        checkpoint, bench_reader(run), run.draft_identity, sampling,
        f"retrain it on records without these prompts ({train_command(path, run.cfg.experiment)}"
        " after a harvest of other data settings), or bench prompts of its records' test split "
        "(bench.split=test with the data settings it was harvested with)",
    )  # fmt: skip
    scorer = CheckpointVerifier(checkpoint, run.draft_model)
    record = {
        **({} if overlap is None else {"train_overlap": overlap}),
        **OmegaConf.to_container(node.verifier),  # type: ignore[dict-item]
        "path": str(path),
        "hidden_layer": int(checkpoint.meta.get("hidden_layer", -1)),
        "calibration": checkpoint.meta.get("calibration"),  # None: an uncalibrated (T = 1) one
        "prior": scorer.prior,
    }
    return scorer, record


def _table(name: str, node: DictConfig, run: RunInputs) -> tuple[Any, dict[str, Any]]:
    if not run.has_companion:
        if node.table.get("optional", False):  # the policy runs without it
            return None, {**OmegaConf.to_container(node.table), "path": None}  # type: ignore[dict-item]
        raise FileNotFoundError(f"{name} needs a companion model (models.companion)")
    path = Path(run.cfg.experiment_dir) / "tables" / "sv_table.json"
    table = SVTable.load(path, node.table.binning)  # a missing table names stage=tables
    overlap = check_fitted_table(
        table, path, bench_reader(run), run.identities,
        "refit it on records without these prompts (stage=harvest with other data settings, "
        "then stage=tables), or bench prompts outside tables.fit_splits",
    )  # fmt: skip
    record = {**OmegaConf.to_container(node.table), "path": str(path)}  # type: ignore[dict-item]
    if overlap is not None:
        record["train_overlap"] = overlap
    return table.on(run.device), record


def _companion_plan(name: str, node: DictConfig, run: RunInputs) -> tuple[Any, dict[str, Any]]:
    """sv's choice, round by round, whether to read its companion (its `prior` rounds start
    from the bench's alpha)."""
    plan = CompanionPlan(run.alpha, **OmegaConf.to_container(node.companion_plan))  # type: ignore[arg-type]
    return plan, plan.record()


RUNTIME: dict[str, Callable[[str, DictConfig, RunInputs], tuple[Any, Any]]] = {
    "gamma": _sd_gamma,
    "planner": _planner,
    "verifier": _verifier,
    "table": _table,
    "companion_plan": _companion_plan,
}  # entry -> (the object passed for it, what results.json records of it)


ENTRY_NEEDS = {  # a config entry the bench fills in -> the run-time need it serves
    "planner": "latency",
    "verifier": "verifier",
    "table": "table",
    "companion_plan": "companion",
}


def check_needs(name: str, node: DictConfig) -> None:
    """Refuse a config that hands its method an input the method's traits do not need: the
    bench would load a verifier or table the policy never reads, and export would copy it."""
    needs = traits_of(node, name).needs
    extra = sorted({ENTRY_NEEDS[e] for e in runtime_entries(node) if e in ENTRY_NEEDS} - set(needs))
    if extra:
        raise MethodError(
            f"methods.{name} configures {', '.join(extra)} but its class's traits need only "
            f"{sorted(needs) or 'nothing'}: drop the entry, or declare the need in its traits"
        )


def build_policy(name: str, node: DictConfig, run: RunInputs) -> tuple[Policy, dict[str, Any]]:
    """The method's policy and its settings as results.json records them."""
    check_needs(name, node)
    inputs, record = {}, {}
    for key in runtime_entries(node):
        inputs[key], record[key] = RUNTIME[key](name, node, run)
    policy = instantiate(node, **inputs)
    params = OmegaConf.to_container(node, resolve=True)
    settings = {k: v for k, v in params.items() if k != "_target_"}  # type: ignore[union-attr]
    return policy, {**settings, **record}


def plan_methods(
    cfg: DictConfig,
    sd_gamma: int,
    draft_model,
    has_companion: bool,
    device: torch.device | str = "cpu",
    draft_identity: dict[str, Any] | None = None,
    alpha: float | None = None,
    identities: dict[str, dict[str, Any]] | None = None,
    prompt_ids: list[str] | None = None,
) -> MethodPlan:
    b = cfg.bench
    unknown = unknown_methods(cfg.methods, b.methods)
    if unknown:
        known = ", ".join((*cfg.methods, *OUTSIDE))
        raise ValueError(f"unknown bench.methods {unknown}; choose from {known}")
    run = RunInputs(
        cfg,
        sd_gamma,
        draft_model,
        has_companion,
        torch.device(device),
        draft_identity,
        alpha,
        identities,
        prompt_ids,
    )
    plan = MethodPlan({}, {}, {}, {})
    for name in b.methods:
        try:
            if name in PEERS:
                tokens = b[name].num_assistant_tokens
                n = max(1, sd_gamma) if tokens == "auto" else int(tokens)  # HF drafts >= 1
                plan.peers[name] = {"schedule": PEERS[name], "num_assistant_tokens": n}
                plan.settings[name] = dict(plan.peers[name])
            elif name == HF_STATIC:
                plan.peers[name] = hf_static_settings(cfg, run.device)
                plan.settings[name] = dict(plan.peers[name])
            elif name in VLLM_NAMES:
                plan.settings[name] = vllm_settings(name, run)
            else:
                plan.policies[name], plan.settings[name] = build_policy(
                    name, cfg.methods[name], run
                )
        except (FileNotFoundError, PeerUnavailable) as err:
            plan.skipped[name] = str(err)
    return plan


def at_batch_size(plan: MethodPlan, cfg: DictConfig, sd_gamma: int) -> MethodPlan:
    """The plan one batch size runs: methods whose config says `gamma: auto` (and peers with
    `num_assistant_tokens: auto`) take that batch size's gamma (where sd's planner starts;
    the planner itself, with what it learnt, is shared); every other policy is shared."""
    policies, settings = dict(plan.policies), {k: dict(v) for k, v in plan.settings.items()}
    for name, policy in plan.policies.items():
        if "gamma" in runtime_entries(cfg.methods[name]):
            policies[name] = dataclasses.replace(policy, gamma=sd_gamma)  # type: ignore[type-var]
            settings[name]["gamma"] = sd_gamma
    peers = {k: dict(v) for k, v in plan.peers.items()}
    for name, peer in peers.items():
        if (
            name in PEERS and cfg.bench[name].num_assistant_tokens == "auto"
        ):  # HF drafts at least one token
            peer["num_assistant_tokens"] = settings[name]["num_assistant_tokens"] = max(1, sd_gamma)
    return MethodPlan(policies, peers, dict(plan.skipped), settings)
