"""What the bench loads and decides before it decodes (`prepare`): the models and prompts,
the engine, the latency profile and sd's gamma per batch size (profile_and_gamma.py), alpha
(alpha.py) and the methods' plan, held in a `Setup`."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf

from sprinter_train.bench.quality.guard import tally_scores
from sprinter_train.bench.run.alpha import estimate_alpha
from sprinter_train.bench.run.methods import MethodPlan, plan_methods, verifier_hidden_layer
from sprinter_train.bench.run.phases import Phases, phase, runner_compile_seconds
from sprinter_train.bench.run.profile_and_gamma import (
    checked_profile,
    gamma_source,
    latency_profile,
    sd_gamma,
)
from sprinter_train.bench.run.stop_choice import choose_stop_rules
from sprinter_train.bench.timing.latency import LatencyProfile
from sprinter_train.bench.timing.profile_check import ProfileCheck
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.core.validation import raise_problems
from sprinter_train.data.prompts import Prompt, load_prompts
from sprinter_train.decoding.builder import build_engine, runner_layout
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies.registry import traits_of
from sprinter_train.harvest.manifest import model_identity
from sprinter_train.models.roles import Roles, load_roles, model_specs
from sprinter_train.models.shapes import hidden_layer_fits, model_shape

log = logging.getLogger(__name__)


@dataclass
class Setup:
    """What the bench loaded and decided before decoding: models, prompts, the engine, the
    latency profile and its check, the acceptance estimate, sd's gamma per batch size and
    the methods' plan."""

    models: Roles
    prompts: list[Prompt]
    engine: Engine
    device: torch.device
    dtype: torch.dtype
    batch_sizes: list[int]
    profile: LatencyProfile
    verdict: ProfileCheck
    alpha: float
    alpha_source: str
    gammas: dict[int, int]
    plan: MethodPlan
    gamma_source: str = ""  # how the gammas were chosen (gamma_source), as results.md says it
    profile_history: list[str] = dataclasses.field(default_factory=list)  # reused / measured
    # the untimed set-up phases so far (bench/run/phases.py): decode_all adds hf_static's and
    # the warm-ups
    phases: Phases = dataclasses.field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [m for m in self.plan.settings if m not in self.plan.skipped]


def prepare(cfg: DictConfig, device: torch.device, dtype: torch.dtype) -> Setup:
    """Load the models and prompts, build the engine, measure (or reuse and check) the
    latency profile, estimate alpha, choose sd's gamma per batch size and plan the methods."""
    b = cfg.bench
    # every verifier the methods read, its sidecar checked, before any model loads
    hidden_layer = verifier_hidden_layer(cfg)
    raise_problems(layer_problems(cfg, hidden_layer))
    models = load_roles(cfg.models, device, dtype, companion=wants_companion(cfg))
    data_cfg = {**OmegaConf.to_container(cfg.data, resolve=True), "num_prompts": int(b.num_prompts)}
    prompts = load_prompts(data_cfg, models.tokenizer, split=b.split)
    if not prompts:
        raise ValueError(f"no prompts in split {b.split!r} of data={cfg.data.get('name')}")
    batch_sizes = batch_sizes_for([int(size) for size in b.batch_sizes], len(prompts))
    vocab = models.vocab_size
    engine = build_engine(
        models.target.model,
        SamplingConfig.from_cfg(cfg.sampling),
        vocab,
        draft=models.draft.model,
        companion=None if models.companion is None else models.companion.model,
        layout=runner_layout(cfg.decoding, device),
        hidden_layer=hidden_layer,
        eos_token_id=models.eos_token_id,
        pack_every=int(cfg.decoding.pack_every),
    )
    began = time.perf_counter()
    history: list[str] = []  # what this run did for its profile, as results.md says it
    phases: Phases = []
    compiling = runner_compile_seconds(engine)
    with phase(phases, "latency profile", compiling):
        profile = latency_profile(cfg, models, device, batch_sizes, engine, history)
    log.info(
        "bench: latency profile ready in %.1f s (%.1f s of it compiling)",
        time.perf_counter() - began,
        compiling(),
    )
    identities = {role: model_identity(getattr(models, role)) for role in ("target", "draft")}
    with phase(phases, "alpha and the profile's check", compiling):
        alpha, alpha_source = estimate_alpha(engine, prompts[0], cfg, identities)
        profile, verdict = checked_profile(
            cfg, engine, models, device, batch_sizes, profile, prompts[0], history
        )
    engine.timings.set_priors(**profile.priors())  # then corrected by the run's forwards
    log.info(
        "bench: profile, alpha %.3f and the profile's check in %.1f s",
        alpha,
        time.perf_counter() - began,
    )
    gammas = {size: sd_gamma(cfg, profile, alpha, size, verdict) for size in batch_sizes}
    plan = plan_methods(
        cfg,
        gammas[1],
        models.draft.model,
        models.companion is not None,
        device,
        draft_identity=model_identity(models.draft),
        alpha=alpha,
        identities={m.role: model_identity(m) for m in models.all()},
        prompt_ids=[p.prompt_id for p in prompts],
    )
    for name, reason in plan.skipped.items():
        log.warning("bench: skipping %s: %s", name, reason)
    if all(name in plan.skipped for name in plan.settings.keys() | plan.skipped.keys()):
        reasons = "; ".join(f"{name}: {why}" for name, why in plan.skipped.items())
        raise ValueError(f"stage=bench: every method of bench.methods was skipped ({reasons})")
    choose_stop_rules(cfg, plan.policies, plan.settings, profile, batch_sizes)
    tally_scores(plan)  # the trained verifiers' mean scores, for results.md's domain check
    return Setup(
        models, prompts, engine, device, dtype, batch_sizes, profile, verdict, alpha,
        alpha_source, gammas, plan, gamma_source(cfg, verdict), history, phases,
    )  # fmt: skip


def layer_problems(cfg: DictConfig, layer: int) -> list[str]:
    """The draft layer the bench's verifiers read (`layer`: their sidecars' hidden_layer, from
    their records' harvest.hidden_layer) must exist on the bench's draft, read from its config
    before it loads: the draft's runner hands it to them, and one past its layers failed
    inside the latency profile."""
    draft = model_shape(model_specs(cfg.models), "draft") if layer != -1 else None
    if draft is None or hidden_layer_fits(layer, draft):
        return []
    return [
        f"models.draft={draft.name}: the verifiers of bench.methods read its hidden layer "
        f"{layer} (their records' harvest.hidden_layer), out of range for {draft.describe()}: "
        f"{draft.hidden_layers()}. Bench them with the draft they were trained on, or "
        "harvest and train them again for this one"
    ]


def wants_companion(cfg: DictConfig) -> bool:
    """Whether any method run reads the companion (SV's, and an SV table's, A): loading an
    unused one costs memory and time, and a machine may not have it (a rented GPU machine
    carries only what the run needs)."""
    methods = cfg.get("methods") or {}
    reads = {"companion", "table"}
    return any(
        reads & traits_of(methods[name], name).needs
        for name in cfg.bench.methods
        if name in methods
    )


def batch_sizes_for(asked: list[int], prompts: int) -> list[int]:
    """The batch sizes that run: batch 1 always, and none above the number of prompts (3
    prompts at batch 64 are one group of 3, which the report would call batch 64)."""
    sizes = sorted({1, *(min(size, prompts) for size in asked)})
    if any(size > prompts for size in asked):
        log.warning(
            "bench: %d prompts: batch sizes %s run as %s (a group cannot hold more rows than "
            "there are prompts)",
            prompts,
            sorted(asked),
            sizes,
        )
    return sizes
