"""The exported methods as transformers `custom_generate` callables, and the entry of an
export folder's custom_generate/generate.py.

Each callable works three ways:

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

Predictors may be given as objects (predictors.py) or paths: a verifier's .safetensors (its
.json sidecar beside it), SV's sv_table.json, bench/latency.json. Defaults of the settings
are conf/methods/<name>.yaml's (tests/test_hf_export.py checks they agree).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationMixin

from .bundle import Bundle
from .identity import check_model
from .predictors import Latency, Table, Verifier
from .prepare import SpeculativeOutput, run
from .rules import LearnedRule, SprinterRule, SVIPRule, SVRule

Output = torch.Tensor | SpeculativeOutput
UNSUPPORTED_ARGUMENTS = (  # generate() arguments a callable custom_generate never receives
    "streamer",
    "prefix_allowed_tokens_fn",
    "negative_prompt_ids",
    "negative_prompt_attention_mask",
)


def load_verifier(verifier: Verifier | str | Path | None) -> Verifier:
    if verifier is None:
        raise ValueError("this method needs a verifier: pass verifier=<verifier-*.safetensors>")
    if isinstance(verifier, Verifier):
        return verifier
    path = Path(verifier)
    return Verifier(path.read_bytes(), json.loads(path.with_suffix(".json").read_text()))


def load_table(table: Table | str | Path | None, binning: str | None = None) -> Table:
    if table is None:
        raise ValueError("this method needs SV's table: pass table=<tables/sv_table.json>")
    return (
        table if isinstance(table, Table) else Table(json.loads(Path(table).read_text()), binning)
    )


def load_latency(latency: Latency | str | Path | Mapping[str, Any] | None) -> Latency:
    if latency is None:
        raise ValueError("this method plans with a latency profile: pass latency=<latency.json>")
    if isinstance(latency, Latency):
        return latency
    if isinstance(latency, Mapping):
        return Latency(dict(latency))
    return Latency(json.loads(Path(latency).read_text()))


def _direct(*prepared: Any) -> bool:
    """Called by the user rather than by transformers (which always passes these three)."""
    return any(value is None for value in prepared)


def _through_transformers(
    method: Callable[..., Output],
    model: torch.nn.Module,
    input_ids: torch.Tensor | None,
    own: dict[str, Any],
    model_kwargs: dict[str, Any],
    **prepared: Any,
) -> Output:
    """Let transformers prepare the call (config, lengths, stopping criteria), then run; the
    draft may come as `assistant_model=` here."""
    assistant = model_kwargs.pop("assistant_model", None)
    if own.get("draft_model") is None:
        own["draft_model"] = assistant
    return GenerationMixin.generate(
        model, input_ids, custom_generate=method, **prepared, **own, **model_kwargs
    )


def _draft(draft_model: torch.nn.Module | None, name: str) -> torch.nn.Module:
    if draft_model is None:
        raise ValueError(
            f"{name} needs the draft model: pass draft_model=<draft> (transformers does not "
            "hand assistant_model to a callable custom_generate; an export folder's "
            "generate.py takes assistant_model=)"
        )
    return draft_model


def sprinter(
    model: torch.nn.Module,
    input_ids: torch.Tensor | None = None,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    *,
    draft_model: torch.nn.Module | None = None,
    verifier: Verifier | str | Path | None = None,
    tau: float = 0.5,
    max_run: int = 16,
    **model_kwargs: Any,
) -> Output:
    """SPRINTER Alg. 2 (lossy by design): draft while the verifier's score >= tau, the target
    checks only the token the verifier rejects."""
    own = {"draft_model": draft_model, "verifier": verifier, "tau": tau, "max_run": max_run}
    if _direct(logits_processor, stopping_criteria, generation_config):
        return _through_transformers(
            sprinter,
            model,
            input_ids,
            own,
            model_kwargs,
            generation_config=generation_config,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
        )
    draft = _draft(draft_model, "sprinter")
    checked = load_verifier(verifier)
    rule = SprinterRule(checked, float(tau), int(max_run), draft.get_input_embeddings())
    return run(
        model,
        input_ids,  # type: ignore[arg-type]
        generation_config,
        stopping_criteria,
        model_kwargs,
        draft,
        rule,
        hidden_layer=checked.hidden_layer,
        fitted_sampling=checked.meta.get("sampling"),
    )


def svip(
    model: torch.nn.Module,
    input_ids: torch.Tensor | None = None,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    *,
    draft_model: torch.nn.Module | None = None,
    h: float = 0.5,
    c: float = 0.15,
    max_gamma: int = 8,
    warped_entropy: bool = False,
    **model_kwargs: Any,
) -> Output:
    """SVIP (lossless): draft until sqrt(c H_q) > h; nothing learned."""
    own = {
        "draft_model": draft_model,
        "h": h,
        "c": c,
        "max_gamma": max_gamma,
        "warped_entropy": warped_entropy,
    }
    if _direct(logits_processor, stopping_criteria, generation_config):
        return _through_transformers(
            svip,
            model,
            input_ids,
            own,
            model_kwargs,
            generation_config=generation_config,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
        )
    rule = SVIPRule(float(h), float(c), int(max_gamma), bool(warped_entropy))
    draft = _draft(draft_model, "svip")
    return run(model, input_ids, generation_config, stopping_criteria, model_kwargs, draft, rule)  # type: ignore[arg-type]


def sv(
    model: torch.nn.Module,
    input_ids: torch.Tensor | None = None,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    *,
    draft_model: torch.nn.Module | None = None,
    companion_model: torch.nn.Module | None = None,
    table: Table | str | Path | None = None,
    binning: str | None = None,
    latency: Latency | str | Path | Mapping[str, Any] | None = None,
    max_gamma: int = 8,
    **model_kwargs: Any,
) -> Output:
    """SV §5 exact (lossless): draw while the table's estimated goodput rises; needs the
    companion model the table was fitted with."""
    own = {
        "draft_model": draft_model,
        "companion_model": companion_model,
        "table": table,
        "binning": binning,
        "latency": latency,
        "max_gamma": max_gamma,
    }
    if _direct(logits_processor, stopping_criteria, generation_config):
        return _through_transformers(
            sv,
            model,
            input_ids,
            own,
            model_kwargs,
            generation_config=generation_config,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
        )
    if companion_model is None:
        raise ValueError("sv needs the companion model its table was fitted with: companion_model=")
    rule = SVRule(load_table(table, binning), load_latency(latency), int(max_gamma))
    draft = _draft(draft_model, "sv")
    return run(
        model,
        input_ids,  # type: ignore[arg-type]
        generation_config,
        stopping_criteria,
        model_kwargs,
        draft,
        rule,
        companion=companion_model,
    )


def sd_learned(
    model: torch.nn.Module,
    input_ids: torch.Tensor | None = None,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    *,
    draft_model: torch.nn.Module | None = None,
    verifier: Verifier | str | Path | None = None,
    latency: Latency | str | Path | Mapping[str, Any] | None = None,
    table: Table | str | Path | None = None,
    binning: str | None = None,
    companion_model: torch.nn.Module | None = None,
    max_gamma: int = 8,
    **model_kwargs: Any,
) -> Output:
    """sd_learned (lossless): draft while the goodput estimated from the verifier's calibrated
    P(accept) rises; with a table (and its companion) the two estimates are averaged."""
    own = {
        "draft_model": draft_model,
        "verifier": verifier,
        "latency": latency,
        "table": table,
        "binning": binning,
        "companion_model": companion_model,
        "max_gamma": max_gamma,
    }
    if _direct(logits_processor, stopping_criteria, generation_config):
        return _through_transformers(
            sd_learned,
            model,
            input_ids,
            own,
            model_kwargs,
            generation_config=generation_config,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
        )
    if table is not None and companion_model is None:
        raise ValueError("sd_learned with a table needs its companion model: companion_model=")
    draft = _draft(draft_model, "sd_learned")
    checked = load_verifier(verifier)
    rule = LearnedRule(
        checked,
        load_latency(latency),
        int(max_gamma),
        None if table is None else load_table(table, binning),
        draft.get_input_embeddings(),
    )
    return run(
        model,
        input_ids,  # type: ignore[arg-type]
        generation_config,
        stopping_criteria,
        model_kwargs,
        draft,
        rule,
        companion=companion_model if table is not None else None,
        hidden_layer=checked.hidden_layer,
        fitted_sampling=checked.meta.get("sampling"),
    )


METHODS: dict[str, Callable[..., Output]] = {
    "sprinter": sprinter,
    "sd_learned": sd_learned,
    "svip": svip,
    "sv": sv,
}


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
