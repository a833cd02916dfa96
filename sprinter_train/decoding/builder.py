"""The one place that turns the decoding settings into runners and engines.

The `decoding` section's layout keys (static_cache, compile, compile_drafts, static_capacity,
prefill, prefill_tokens, capture) are declared in stages/schema.py, checked against each
other (`decoding_problems`) and resolved for a device
(`runner_layout`) here, and every stage, the bench, the Hugging Face callables and the
benchmark scripts get their runners (`build_runner`) and engines (`build_engine`) from here,
so a layout means the same thing wherever it is used. These functions take plain mappings:
the stages turn their config into them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from sprinter_train.core.runtime import parse_switch, resolve_compile
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.decoding.engine import PACK_EVERY, Engine
from sprinter_train.decoding.runner.runner import ModelRunner
from sprinter_train.decoding.timings import Timings

DRAFTS = "drafts"  # a layout's settings that differ for the draft and companion runners


def decoding_problems(decoding: Mapping[str, Any]) -> list[str]:
    """The `decoding` section's settings that contradict each other, one line each (what
    each key holds is declared in stages/schema.py)."""
    problems: list[str] = []
    if (
        parse_switch(decoding.get("static_cache")) is False
        and parse_switch(decoding.get("compile")) is True
    ):
        problems.append(
            "decoding.compile=true needs the static layout: decoding.static_cache=false forbids it"
        )
    return problems


def compiles(decoding: Mapping[str, Any], device: torch.device) -> bool:
    """Whether `decoding.compile` compiles on `device` (auto: on CUDA only, see
    `core.runtime.resolve_compile`); the engine's layout and the bench's hf_static peer both
    follow it."""
    return resolve_compile(decoding.get("compile", "auto"), device)


def runner_layout(decoding: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """`ModelRunner`'s layout keyword arguments from the `decoding` section on `device`:
    `static` (`static_cache`; auto follows compile), `compiled` (`compile`, static only),
    `min_capacity` (`static_capacity`), `padded_prefill` (`prefill`; auto: padded on CUDA,
    see `runner.prefill_groups`), `prefill_tokens` and `captured` (`capture`; auto leaves it
    to the runner, true asks for CUDA graphs where they exist: on CUDA)."""
    compiled = compiles(decoding, device)
    static_on = parse_switch(decoding.get("static_cache", "auto"))
    static = compiled if static_on == "auto" else bool(static_on)
    capture = parse_switch(decoding.get("capture", "auto"))
    prefill = str(decoding.get("prefill", "auto"))
    layout = {
        "static": static,
        "compiled": compiled and static,
        "min_capacity": int(decoding.get("static_capacity", 0) or 0),
        "padded_prefill": device.type == "cuda" if prefill == "auto" else prefill == "padded",
        "prefill_tokens": int(decoding.get("prefill_tokens", 1 << 16)),
        "captured": None if capture == "auto" else bool(capture) and device.type == "cuda",
    }
    return {**layout, DRAFTS: draft_changes(decoding, layout, device)}


def draft_changes(
    decoding: Mapping[str, Any], layout: Mapping[str, Any], device: torch.device
) -> dict[str, Any]:
    """What `decoding.compile_drafts=false` changes in the draft's and companion's layout
    where the target compiles: their forwards stay uncompiled, and on CUDA replay from
    graphs captured by hand (unless `capture=false`), so a cold start compiles the
    target's graphs alone while a draft step still costs one graph launch. auto and true
    leave them as the target's."""
    switch = parse_switch(decoding.get("compile_drafts", "auto"))
    if switch in ("auto", True) or not layout["compiled"]:
        return {}
    captured = layout["captured"]
    return {"compiled": False, "captured": device.type == "cuda" if captured is None else captured}


def build_runner(
    model: torch.nn.Module,
    vocab_size: int,
    layout: Mapping[str, Any] | None = None,
    hidden_layer: int = -1,
    lean: bool | None = None,
    role: str = "target",
) -> ModelRunner:
    """A runner of `model` in `layout` (`runner_layout`'s keys; None or empty: the runner's
    own defaults) for `role` (target, draft or companion: the two drafts take the layout's
    `DRAFTS` changes). `lean`: None lets the runner choose (see `ModelRunner`); the lean
    draft keeps its own layout whatever `layout` says."""
    options = dict(layout or {})
    changes = options.pop(DRAFTS, {})
    if role != "target":
        options.update(changes)
    return ModelRunner(model, vocab_size, hidden_layer=hidden_layer, lean=lean, **options)


def build_engine(
    target: torch.nn.Module | ModelRunner,
    sampling: SamplingConfig,
    vocab_size: int,
    *,
    draft: torch.nn.Module | ModelRunner | None = None,
    companion: torch.nn.Module | ModelRunner | None = None,
    layout: Mapping[str, Any] | None = None,
    hidden_layer: int = -1,
    eos_token_id: int | None = None,
    pack_every: int = PACK_EVERY,
    timings: Timings | None = None,
) -> Engine:
    """An engine over the target and the optional draft and companion, each built in one
    `layout` on the shared vocabulary (`vocab_size`); the draft's runner hands verifiers its
    `hidden_layer`. A role given as a runner is taken as built: a harvest reuses its runners
    (their compiled graphs and KV buffers) across many engines."""

    def runner(model: torch.nn.Module | ModelRunner, role: str, layer: int = -1) -> ModelRunner:
        if isinstance(model, ModelRunner):
            return model
        return build_runner(model, vocab_size, layout, layer, role=role)

    return Engine(
        runner(target, "target"),
        sampling,
        draft=None if draft is None else runner(draft, "draft", hidden_layer),
        companion=None if companion is None else runner(companion, "companion"),
        eos_token_id=eos_token_id,
        pack_every=pack_every,
        timings=timings,
    )
