"""The one place that turns the decoding settings into runners and engines.

The `decoding` section's layout keys (static_cache, compile, compile_drafts, static_capacity,
prefill, prefill_tokens, capture, compile_cache) are declared in stages/schema.py, checked
against each other (`decoding_problems`), read for a device (`runner_layout`) and resolved,
per model and role, into a frozen `RunnerLayout` (`resolve_layout`) here and nowhere else:
the runner and its backends only read the resolved layout. Every stage, the bench, the
Hugging Face callables and the benchmark scripts get their runners (`build_runner`) and
engines (`build_engine`) from here, so a layout means the same thing wherever it is used,
and a compiled layout's compile cache is pointed at by the builder itself (no caller has to
remember to). These functions take plain mappings: the stages turn their config into them.
The values conf/config.yaml gives `decoding.prefill_tokens` and `decoding.pack_every` have no
second copy here: a layout that pads its prefill and every engine are handed them
(`runner_layout` reads the first, `build_engine` takes the second), and a missing one is an
error, not a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from sprinter_train.core.compile_cache import CompileCache, cache_folder
from sprinter_train.core.runtime import parse_switch, resolve_compile
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.decoding.cache.static import supports_static
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.runner.layout import RunnerLayout
from sprinter_train.decoding.runner.runner import ModelRunner
from sprinter_train.decoding.timings import Timings
from sprinter_train.models.lean import uses_lean

DRAFTS = "drafts"  # a layout's settings that differ for the draft and companion runners
# what a layout mapping may hold (`runner_layout`'s keys and `lean`); absent: the default
SETTINGS = frozenset(
    {
        "lean",
        "static",
        "compiled",
        "captured",
        "min_capacity",
        "padded_prefill",
        "prefill_tokens",
        "compile_cache",
        DRAFTS,
    }
)


def decoding_setting(decoding: Mapping[str, Any], key: str) -> Any:
    """`decoding.<key>`, a setting code keeps no default of (conf/config.yaml's is the one):
    a mapping without it is refused, naming it."""
    if key not in decoding:
        raise ValueError(
            f"decoding.{key} is not set: it has no default in code; conf/config.yaml's "
            f"decoding section sets it (pass the config's decoding section, or {key}= itself)"
        )
    return decoding[key]


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
    see `runner.prefill_groups`), `prefill_tokens` (required: see `decoding_setting`),
    `captured` (`capture`; auto, None, is
    resolved per runner by `resolve_layout`, true asks for CUDA graphs where they exist: on
    CUDA) and, where it compiles, `compile_cache` (`decoding.compile_cache` as a
    `CompileCache`: its folder, or None, the on-disk caches off)."""
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
        "prefill_tokens": int(decoding_setting(decoding, "prefill_tokens")),
        "captured": None if capture == "auto" else bool(capture) and device.type == "cuda",
        "compile_cache": None,
    }
    if compiled:
        setting = decoding.get("compile_cache", "auto")
        layout["compile_cache"] = CompileCache(cache_folder(setting), setting)
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


def compiled_over_lean(device: torch.device) -> bool:
    """Whether a compiled runner runs a lean-capable draft compiled in the static layout
    rather than lean and eager: the lean buffers grow per step, so the lean path cannot
    compile. Chosen on a GPU, where the compiled step wins; not on a CPU, where the lean
    prepacked eager step does (docs/results/design-figures.md)."""
    return device.type == "cuda"


def resolve_layout(
    model: torch.nn.Module, settings: Mapping[str, Any], role: str = "target"
) -> RunnerLayout:
    """The `RunnerLayout` of `model` for `role` from a layout mapping (`runner_layout`'s
    keys, any subset; `lean` too): every choice the runner and its backends read, made here.

    - `lean` (absent or None: `uses_lean`, a model that supports it unless loaded with
      `models.lean_draft=false`) runs the distilled draft through `LeanDraft`, except that
      a compiled or captured static layout of a model that supports one takes it instead
      where `compiled_over_lean` says so (the lean buffers grow step by step: no settled
      shapes to compile); an explicit `lean` is kept.
    - `static`: any other model that supports it (`supports_static`) runs the static layout;
      `compiled` (static only) compiles its body; `captured` (absent or None: compiled on a
      GPU; any static layout when true) replays its forwards from graphs captured by hand,
      with coarse spans; a compiled layout on a GPU not captured runs `reduce-overhead`.
    - `padded_prefill` (absent or None: on CUDA); `prefill_tokens`, the padded tokens one
      prefill forward holds at most, is required where the prefill is padded (the one place
      it is read; by length, it may be absent: None); `min_capacity`.
    - `compile_cache`: kept where the layout compiles.
    - `role`: the draft and companion take the mapping's `DRAFTS` changes."""
    unknown = set(settings) - SETTINGS
    if unknown:
        raise TypeError(f"unknown layout settings: {sorted(unknown)}")
    options = {k: v for k, v in settings.items() if k != DRAFTS}
    if role != "target":
        options.update(settings.get(DRAFTS) or {})
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    lean_asked, captured_asked = options.get("lean"), options.get("captured")
    static_asked, compiled_asked = options.get("static", False), options.get("compiled", False)
    lean = uses_lean(model) if lean_asked is None else bool(lean_asked)
    asks_static = static_asked and (compiled_asked or captured_asked)
    if lean_asked is None and asks_static and supports_static(model):
        lean = lean and not compiled_over_lean(device)
    static = bool(static_asked) and not lean and supports_static(model)
    compiled = bool(compiled_asked) and static
    captured = static and (compiled and cuda if captured_asked is None else bool(captured_asked))
    reduce_overhead = compiled and cuda and not captured
    padded_asked = options.get("padded_prefill")
    padded = cuda if padded_asked is None else bool(padded_asked)
    prefill_tokens = options.get("prefill_tokens")
    if padded and prefill_tokens is None:
        raise ValueError(
            f"the {role}'s layout pads its prefill (padded_prefill, on CUDA by default) but sets "
            "no prefill_tokens, the padded tokens one prefill forward holds at most: it has no "
            "default in code; pass decoding.prefill_tokens (conf/config.yaml; `runner_layout` "
            "reads it) or padded_prefill=False"
        )
    return RunnerLayout(
        backend="lean" if lean else "static" if static else "dynamic",
        compiled=compiled,
        captured=captured,
        reduce_overhead=reduce_overhead,
        coarse_spans=captured,
        prefills=static and not reduce_overhead,
        shrink_rows=not (compiled and cuda),
        min_capacity=int(options.get("min_capacity", 0) or 0),
        padded_prefill=padded,
        prefill_tokens=None if prefill_tokens is None else int(prefill_tokens),
        compile_cache=options.get("compile_cache") if compiled else None,
    )


def build_runner(
    model: torch.nn.Module,
    vocab_size: int,
    layout: Mapping[str, Any] | None = None,
    hidden_layer: int = -1,
    lean: bool | None = None,
    role: str = "target",
) -> ModelRunner:
    """A runner of `model` in `layout` (`runner_layout`'s keys; None or empty: the defaults,
    which on CUDA pad the prefill and so need `prefill_tokens`)
    for `role` (target, draft or companion: the two drafts take the layout's `DRAFTS`
    changes), resolved by `resolve_layout`; `lean`: None leaves it to `resolve_layout`, and
    a lean draft keeps its own layout whatever `layout` says. A compiled layout's compile
    cache is pointed at here, before the runner compiles anything."""
    resolved = resolve_layout(model, {**(layout or {}), "lean": lean}, role)
    if resolved.compile_cache is not None:
        resolved.compile_cache.apply()
    return ModelRunner(model, vocab_size, hidden_layer=hidden_layer, layout=resolved)


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
    pack_every: int,
    timings: Timings | None = None,
) -> Engine:
    """An engine over the target and the optional draft and companion, each built in one
    `layout` on the shared vocabulary (`vocab_size`); the draft's runner hands verifiers its
    `hidden_layer`. A role given as a runner is taken as built: a harvest reuses its runners
    (their compiled graphs and KV buffers) across many engines. `pack_every`:
    `decoding.pack_every`, required (no default in code: conf/config.yaml's is the one)."""

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
