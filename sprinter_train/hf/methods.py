"""The exported methods as transformers `custom_generate` callables, and the entry of an
export folder's custom_generate/generate.py.

Each callable is made by `make` from a `Spec`: the engine policy the bench runs for the method
(conf/methods/<name>.yaml's `_target_`), its settings with their defaults (the yaml's; a test
checks they agree) and the predictors it reads. A call loads the predictors with the
package's own readers, builds the policy as the bench does (the verifier's scorer, SV's table
on the device, the latency profile's target forward and drafting step) and has the engine
decode the one sequence (prepare.py). Each callable works three ways:

- `target.generate(**inputs, custom_generate=sprinter_train.hf.sv, draft_model=draft, ...)`:
  transformers prepares the call and hands the callable the predictors by name. It does not
  hand a callable `assistant_model` (it keeps only the callable's own arguments), so the draft
  goes in as `draft_model=`.
- `sprinter_train.hf.sv(target, **inputs, draft_model=draft, ...)` (or `assistant_model=`):
  called directly, the callable passes itself to `GenerationMixin.generate`, as above.
- an export folder: `target.generate(**inputs, custom_generate="<folder>",
  trust_remote_code=True, assistant_model=draft, ...)` runs `exported_generate`, which checks
  the draft (and companion) are the ones the export was made for and calls the callable with
  the folder's predictors and settings.

Predictors may be given as objects (`VerifierCheckpoint`, `SVTable`, `LatencyProfile`) or
paths: a verifier's .safetensors (its .json sidecar beside it), SV's sv_table.json,
bench/latency.json. The profile is planned with as measured, so a call's drafting does not
depend on its own timings (the bench corrects it by the run's forwards).

The engine's `decoding` settings (`bundle.DECODING`: pack_every, prefill_tokens; speed only)
have no default in code: an export folder hands over those its export.json recorded, a call
may pass `decoding={...}`, and a call without either reads conf/config.yaml's decoding section
(`decoding_of`; with the project installed, never inside a folder).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationMixin

from sprinter_train.bench.timing.latency import LatencyProfile
from sprinter_train.decoding.policies import (
    SVIP,
    LearnedLength,
    Method,
    SpecVerification,
    Sprinter,
)
from sprinter_train.decoding.timings import Timings
from sprinter_train.hf.bundle import DECODING, Bundle
from sprinter_train.hf.identity import check_model
from sprinter_train.hf.prepare import SpeculativeOutput, run
from sprinter_train.sv.table import SVTable
from sprinter_train.verifier.checkpoint import VerifierCheckpoint, load_verifier
from sprinter_train.verifier.scorer import CheckpointVerifier

Output = torch.Tensor | SpeculativeOutput
PREPARED = ("input_ids", "logits_processor", "stopping_criteria", "generation_config")
UNSUPPORTED_ARGUMENTS = (  # generate() arguments a callable custom_generate never receives
    "streamer",
    "prefix_allowed_tokens_fn",
    "negative_prompt_ids",
    "negative_prompt_attention_mask",
)


@dataclass(frozen=True)
class Spec:
    """One exported method: the policy class, the settings its callable takes (name ->
    default), and a line about it. What it reads besides the draft is what the class's
    traits need (decoding/policies/registry.py): a verifier, SV's table (required with a companion,
    else optional) and the latency profile."""

    name: str
    policy: type[Method]
    settings: dict[str, Any]
    about: str

    @property
    def verifier(self) -> bool:
        return "verifier" in self.policy.traits.needs

    @property
    def table(self) -> str | None:
        needs = self.policy.traits.needs
        if "table" not in needs:
            return None
        return "required" if "companion" in needs else "optional"

    @property
    def latency(self) -> bool:
        return "latency" in self.policy.traits.needs

    def parameters(self) -> dict[str, Any]:
        """The callable's keyword-only arguments and their defaults."""
        own: dict[str, Any] = {"draft_model": None, "decoding": None}
        if self.verifier:
            own["verifier"] = None
        if self.table:
            own |= {"companion_model": None, "table": None, "binning": None}
        if self.latency:
            own["latency"] = None
        return own | self.settings


SPECS = (
    Spec(
        "sprinter",
        Sprinter,
        {"tau": 0.5, "max_run": 16},
        "SPRINTER Alg. 2 (lossy by design): the draft runs while the verifier's score is >= "
        "tau; the target checks only the token the verifier rejects (kept with min(1, p/q), "
        "else redrawn from norm(max(0, p - q))), so a run the verifier accepts costs no target "
        "call.",
    ),
    Spec(
        "sd_learned",
        LearnedLength,
        {"max_gamma": 8},
        "speculative sampling (lossless) whose drafting length the verifier chooses: the next "
        "draft is drawn while the goodput estimated from its calibrated P(accept) and the "
        "latency profile rises; every drawn draft is verified. With SV's table (and its "
        "companion) the two acceptance estimates are averaged.",
    ),
    Spec(
        "svip",
        SVIP,
        {"h": 0.5, "c": 0.15, "max_gamma": 8, "warped_entropy": False},
        "SVIP (lossless): draft until sqrt(c H_q) > h, H_q the draft's entropy; every drawn "
        "draft is verified. Nothing learned: the folder holds only its settings.",
    ),
    Spec(
        "sv",
        SpecVerification,
        {"max_gamma": 8},
        "SV §5, exact (lossless): before each draft, its gain P(accept | S) times the product "
        "of the refined acceptances P(accept | S, A) of the drafts before it, from SV's table; "
        "draw while the goodput estimated with the latency profile rises. Needs the companion "
        "model the table was fitted with.",
    ),
)


def make(spec: Spec) -> Callable[..., Output]:
    """The `custom_generate` callable of a method (its signature names its own arguments,
    which is how transformers knows what to hand it)."""
    own_defaults = spec.parameters()

    def method(
        model: torch.nn.Module,
        input_ids: torch.Tensor | None = None,
        logits_processor: Any = None,
        stopping_criteria: Any = None,
        generation_config: Any = None,
        **kwargs: Any,
    ) -> Output:
        own = {key: kwargs.pop(key, default) for key, default in own_defaults.items()}
        if any(v is None for v in (logits_processor, stopping_criteria, generation_config)):
            # called by the user (transformers always passes these three): let transformers
            # prepare the call (config, lengths, stopping criteria); the draft may come as
            # `assistant_model=` here
            assistant = kwargs.pop("assistant_model", None)
            if own["draft_model"] is None:
                own["draft_model"] = assistant
            return GenerationMixin.generate(
                model,
                input_ids,
                custom_generate=method,
                generation_config=generation_config,
                logits_processor=logits_processor,
                stopping_criteria=stopping_criteria,
                **own,
                **kwargs,
            )
        return speculate(spec, model, input_ids, generation_config, stopping_criteria, own, kwargs)

    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    keyword = inspect.Parameter.KEYWORD_ONLY
    method.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("model", positional)]
        + [inspect.Parameter(name, positional, default=None) for name in PREPARED]
        + [inspect.Parameter(k, keyword, default=v) for k, v in own_defaults.items()]
        + [inspect.Parameter("model_kwargs", inspect.Parameter.VAR_KEYWORD)]
    )
    method.__name__ = method.__qualname__ = spec.name
    method.__doc__ = spec.about
    return method


def speculate(
    spec: Spec,
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    config: Any,
    stopping_criteria: Any,
    own: dict[str, Any],
    model_kwargs: dict[str, Any],
) -> Output:
    """Load the predictors, build the method's policy and run it on the engine."""
    draft = own.pop("draft_model")
    if draft is None:
        raise ValueError(
            f"{spec.name} needs the draft model: pass draft_model=<draft> (transformers does not "
            "hand assistant_model to a callable custom_generate; an export folder's "
            "generate.py takes assistant_model=)"
        )
    inputs: dict[str, Any] = {}
    fitted: dict[str, Any] = {}
    if spec.verifier:
        checkpoint = as_checkpoint(own.pop("verifier"))
        inputs["verifier"] = CheckpointVerifier(checkpoint, draft)
        fitted["hidden_layer"] = int(checkpoint.meta.get("hidden_layer", -1))
        fitted["fitted_sampling"] = checkpoint.meta.get("sampling")
    companion = None
    if spec.table:
        table, binning = own.pop("table"), own.pop("binning")
        companion = own.pop("companion_model")
        if table is None and spec.table == "required":
            raise ValueError(f"{spec.name} needs SV's table: pass table=<tables/sv_table.json>")
        if table is not None and companion is None:
            raise ValueError(
                f"{spec.name} with SV's table needs the companion model it was fitted with: "
                "companion_model=<companion>"
            )
        device = next(model.parameters()).device
        inputs["table"] = None if table is None else as_table(table, binning).on(device)
        companion = None if table is None else companion
    timings = None
    if spec.latency:  # priced at the profile as measured: a call does not learn its own timings
        timings = Timings(**as_profile(own.pop("latency")).priors(), learn=False)
    settings = {key: type(default)(own.pop(key)) for key, default in spec.settings.items()}
    policy = spec.policy(**inputs, **settings)
    return run(
        model,
        input_ids,
        config,
        stopping_criteria,
        model_kwargs,
        policy,
        draft,
        decoding_of(own.pop("decoding")),
        companion,
        timings,
        **fitted,
    )


def decoding_of(given: Mapping[str, Any] | None) -> dict[str, int]:
    """The engine's `decoding` settings (`DECODING`): those given (an export folder's, from its
    export.json), else conf/config.yaml's decoding section, read as the stages read it (only
    with the project installed: a folder always hands over its own)."""
    if given is None:
        from sprinter_train.core.config import conf_defaults  # omegaconf: outside the folder

        given = conf_defaults("config.yaml", "decoding")
    missing = [f"decoding.{key}" for key in DECODING if key not in given]
    if missing:
        raise ValueError(
            f"decoding= lacks {', '.join(missing)}: the engine takes {', '.join(DECODING)}, "
            "which have no default in code (conf/config.yaml's decoding section has them)"
        )
    return {key: int(given[key]) for key in DECODING}


def as_checkpoint(verifier: VerifierCheckpoint | str | Path | None) -> VerifierCheckpoint:
    if verifier is None:
        raise ValueError("this method needs a verifier: pass verifier=<verifier-*.safetensors>")
    return verifier if isinstance(verifier, VerifierCheckpoint) else load_verifier(verifier)


def as_table(table: SVTable | str | Path, binning: str | None) -> SVTable:
    return table if isinstance(table, SVTable) else SVTable.load(table, binning)


def as_profile(latency: LatencyProfile | str | Path | Mapping[str, Any] | None) -> LatencyProfile:
    if latency is None:
        raise ValueError("this method plans with a latency profile: pass latency=<latency.json>")
    if isinstance(latency, LatencyProfile):
        return latency
    if isinstance(latency, Mapping):
        return LatencyProfile.from_json(dict(latency))
    return LatencyProfile.load(Path(latency))


METHODS: dict[str, Callable[..., Output]] = {spec.name: make(spec) for spec in SPECS}
sprinter, sd_learned, svip, sv = (
    METHODS[name] for name in ("sprinter", "sd_learned", "svip", "sv")
)


def exported_generate(model: torch.nn.Module, files: Mapping[str, str], **kwargs: Any) -> Output:
    """An export folder's `generate(model, ...)`: the arguments transformers' generate got
    (`assistant_model=` the draft, `companion_model=` for sv), the folder's predictors."""
    return generate_with(Bundle.from_embedded(files), model, **kwargs)


def generate_with(bundle: Bundle, model: torch.nn.Module, **kwargs: Any) -> Output:
    """Run the bundle's method; a draft or companion other than the export's is refused."""
    assistant, named = kwargs.pop("assistant_model", None), kwargs.pop("draft_model", None)
    draft = assistant if assistant is not None else named
    if draft is None:
        raise ValueError(
            f"this export ({bundle.method}) speculates with a draft: pass assistant_model=<draft>"
        )
    check_model(bundle.model("draft"), draft, "draft")  # type: ignore[arg-type]
    companion = kwargs.pop("companion_model", None)
    expected = bundle.model("companion")
    if expected is not None:
        if companion is None:
            raise ValueError(
                f"this export ({bundle.method}) reads a companion model's distributions: pass "
                f"companion_model=<{expected.get('name')}>"
            )
        check_model(expected, companion, "companion")
        kwargs["companion_model"] = companion
    given = [name for name in UNSUPPORTED_ARGUMENTS if kwargs.get(name) is not None]
    if given or kwargs.get("synced_gpus"):
        raise ValueError(f"not supported by the speculative methods: {given or ['synced_gpus']}")
    for name in (*UNSUPPORTED_ARGUMENTS, "synced_gpus"):
        kwargs.pop(name, None)
    arguments = {**bundle.arguments(), **kwargs}  # the caller may override a setting
    inputs = arguments.pop("inputs", None)
    method = METHODS[bundle.method]
    return GenerationMixin.generate(
        model, inputs, custom_generate=method, draft_model=draft, **arguments
    )
