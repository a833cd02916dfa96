"""The floor under a batch-1 draft step, measured beside the model's step and the engine's.

At batch 1 on a CPU a decode step multiplies one token's vector by every weight of the model
once, so it cannot be cheaper than streaming those weights: a bare chain of matmuls over the
draft's own weights (same dtype, same threads, no modules, masks or cache) is that floor.
Whatever the Hugging Face forward (a dynamic cache, masks rebuilt every step) and the engine
(the RowCache's bookkeeping, the head scattered to the full vocabulary, warping and sampling
there) add above it is overhead that can be removed; the floor itself only drops with fewer
bytes (a smaller or quantised draft). The four steps are timed in interleaved rounds, like the bench's
latency profile, so machine noise hits all of them alike (in rotating order: see
`interleaved_medians`). The engine step of a draft the engine runs through
`models.lean.LeanDraft` goes through it; its lean model-only step can be timed in the same
rounds too (`lean=True`: a fifth step changes the rotation the four others were measured in).
The engine and the lean runner take the `decoding` section's `pack_every` and
`prefill_tokens` (no default in code: conf/config.yaml's are the ones).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from transformers.pytorch_utils import Conv1D

from sprinter_train.bench.run.provenance import load_average
from sprinter_train.core.runtime import synchronize
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.decoding.batch import Round
from sprinter_train.decoding.builder import build_engine, build_runner, decoding_setting
from sprinter_train.decoding.runner.requests import ForwardRequest
from sprinter_train.models.cache import crop_cache, returned_cache, with_cache
from sprinter_train.models.lean import supports_lean

WARMUP_ROUNDS = 3
STEP_BUDGET = 16  # new tokens the engine step's row may hold (it never holds more than 2)


def step_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every weight a one-token step multiplies by, as (in, out) matrices, each once (tied
    weights count once): the layers' projections, a factorised embedding's up-projection and
    the head the model uses (a restricted head's K rows, not the full vocabulary). GPT-2's
    Conv1D stores (in, out) already; a Linear's weight is transposed (a view, no copy)."""
    seen: dict[int, torch.Tensor] = {}
    head = model.get_output_embeddings()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) or module is head:
            seen.setdefault(id(module.weight), module.weight.t())
        elif isinstance(module, Conv1D):
            seen.setdefault(id(module.weight), module.weight)
    return list(seen.values())


class MatmulChain:
    """One token's vector times each of `weights` in turn, into preallocated outputs: the
    arithmetic and the weight traffic of a step, nothing else."""

    def __init__(self, weights: list[torch.Tensor], seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.weights = weights
        self.inputs = [
            torch.randn((1, w.shape[0]), generator=gen).to(w.device, w.dtype) for w in weights
        ]
        self.outputs = [w.new_empty((1, w.shape[1])) for w in weights]

    @property
    def parameters(self) -> int:
        return sum(w.numel() for w in self.weights)

    @property
    def bytes(self) -> int:
        return sum(w.numel() * w.element_size() for w in self.weights)

    @torch.inference_mode()
    def __call__(self) -> None:
        for x, w, out in zip(self.inputs, self.weights, self.outputs, strict=True):
            torch.mm(x, w, out=out)


class ModelStep:
    """One HF forward of one token after `context` cached tokens (as the latency profile
    times it); the cache is cropped back between calls, outside the timing."""

    def __init__(self, model: torch.nn.Module, prefix: torch.Tensor, next_id: torch.Tensor):
        self.model, self.next_id, self.context = model, next_id, prefix.shape[1]
        with torch.inference_mode():
            self.cache = returned_cache(model(input_ids=prefix, use_cache=True))

    @torch.inference_mode()
    def __call__(self) -> None:
        self.model(
            input_ids=self.next_id,
            use_cache=True,
            logits_to_keep=1,
            **with_cache(self.model, self.cache),
        )

    @torch.inference_mode()
    def reset(self) -> None:
        crop_cache(self.cache, self.context)


class LeanStep:
    """One `LeanDraft` forward of one token after `context` cached tokens and its head (the
    restricted head's own tokens), through `ModelRunner` as the engine calls it, without the
    engine's warping and drawing; the cache goes back to `context` tokens between calls.
    `prefill_tokens`: `decoding.prefill_tokens` (a padded prefill's budget, on CUDA)."""

    def __init__(
        self,
        model: torch.nn.Module,
        prefix: torch.Tensor,
        next_id: torch.Tensor,
        prefill_tokens: int,
    ) -> None:
        vocab = int(model.config.vocab_size)
        self.runner = build_runner(model, vocab, {"prefill_tokens": prefill_tokens}, lean=True)
        self.cache = self.runner.new_cache(1)
        self.context = prefix.shape[1]
        self.runner.prime(self.cache, prefix.tolist())
        device = self.runner.device
        self.ids = next_id.to(device)
        self.counts = torch.ones(1, dtype=torch.long, device=device)
        self.keep = torch.zeros((1, 1), dtype=torch.long, device=device)

    def __call__(self) -> None:
        self.runner.run(
            self.cache, ForwardRequest(self.ids, self.counts, self.keep, restricted=True)
        )

    def reset(self) -> None:
        self.cache.truncate(torch.full_like(self.cache.lengths, self.context))
        self.cache.pack(self.context)


class EngineDraftStep:
    """One `Engine.draft_step` at batch 1 in the middle of a round (a draft fed back, as at
    every step past a round's first): RowCache masks and positions, the body, the head on the
    shared vocabulary, warping and a draw from the row's stream. The cache goes back to
    `context` tokens between calls, outside the timing. `decoding`: the section's
    `pack_every` (the engine's; a step commits no round, so it never packs) and
    `prefill_tokens` (unless `layout`, `runner_layout`'s keys, sets it)."""

    def __init__(
        self,
        draft: torch.nn.Module,
        target: torch.nn.Module,
        sampling: SamplingConfig,
        prompt: list[int],
        decoding: Mapping[str, Any],
        layout: Mapping[str, Any] | None = None,
    ) -> None:
        vocab = min(int(draft.config.vocab_size), int(target.config.vocab_size))
        self.engine = build_engine(
            target,
            sampling,
            vocab,
            draft=draft,
            layout={
                "prefill_tokens": decoding_setting(decoding, "prefill_tokens"),
                **(layout or {}),
            },
            pack_every=int(decoding_setting(decoding, "pack_every")),
        )
        # a static cache holds prompt + budget: each call is undone (`reset`), so a few
        # tokens of budget cover every step
        self.batch = self.engine.new_batch([prompt], max_new_tokens=STEP_BUDGET, seeds=[0])
        self.active = torch.ones(1, dtype=torch.bool, device=self.engine.device)
        self.round = Round()
        with torch.inference_mode():  # the round's first step primes the cache with the prompt
            self.round.steps.append(self.engine.draft_step(self.batch, self.round, self.active))
        self.context = len(prompt)

    @torch.inference_mode()
    def __call__(self) -> None:
        self.round.calls["draft"] = 1  # always the round's second step: feeds the first draft
        self.engine.draft_step(self.batch, self.round, self.active)

    @torch.inference_mode()
    def reset(self) -> None:
        cache = self.batch.caches["draft"]
        cache.truncate(torch.full_like(cache.lengths, self.context))
        cache.pack(self.context)


def interleaved_medians(
    steps: Mapping[str, Callable[[], None]],
    reps: int,
    device: torch.device,
    resets: Mapping[str, Callable[[], None]] | None = None,
) -> dict[str, float]:
    """Median seconds of each step over `reps` rounds (each step once a round, so noise hits
    all alike; `WARMUP_ROUNDS` rounds first, discarded); `resets[name]` runs after that step,
    outside the timing. The order rotates each round: a small draft's weights fit a
    CPU's last-level cache and the target's evict them, so whichever step followed the target
    would always run cold; rotated, every step follows every other equally often."""
    names = list(steps)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps + WARMUP_ROUNDS):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            synchronize(device)
            start = time.perf_counter()
            steps[name]()
            synchronize(device)
            elapsed = time.perf_counter() - start
            if resets and name in resets:
                resets[name]()
            if rep >= WARMUP_ROUNDS:
                times[name].append(elapsed)
    return {name: statistics.median(v) for name, v in times.items()}


@dataclass
class StepFloor:
    """Batch-1 milliseconds of the floor, the draft's model and engine steps and the target's
    model step, from the same rounds."""

    floor_ms: float
    model_ms: float
    engine_ms: float
    target_ms: float
    parameters: int  # weights the floor multiplies by
    matmuls: int
    weight_bytes: int
    context_tokens: int
    reps: int
    load_average: dict[str, float | None]
    lean_ms: float | None = None  # the lean model-only step, for a draft that has one

    @property
    def engine_over_floor(self) -> float:
        return self.engine_ms / self.floor_ms

    @property
    def model_over_floor(self) -> float:
        return self.model_ms / self.floor_ms

    @property
    def c_engine(self) -> float:
        """c as the bench pays it: the engine's draft step over a target step."""
        return self.engine_ms / self.target_ms

    @property
    def c_floor(self) -> float:
        """The lowest c this draft format can reach on this machine (the floor's)."""
        return self.floor_ms / self.target_ms

    def report(self) -> dict[str, float | int | dict[str, float | None]]:
        lean: dict[str, float] = {}
        if self.lean_ms is not None:
            lean = {"lean_step_ms": self.lean_ms, "lean_over_floor": self.lean_ms / self.floor_ms}
        return {
            **lean,
            "floor_ms": self.floor_ms,
            "model_step_ms": self.model_ms,
            "engine_step_ms": self.engine_ms,
            "target_step_ms": self.target_ms,
            "engine_over_floor": self.engine_over_floor,
            "model_over_floor": self.model_over_floor,
            "c_engine": self.c_engine,
            "c_floor": self.c_floor,
            "floor_parameters": self.parameters,
            "floor_matmuls": self.matmuls,
            "floor_weight_mb": self.weight_bytes / 1e6,
            "floor_gb_per_s": self.weight_bytes / self.floor_ms / 1e6,
            "context_tokens": self.context_tokens,
            "reps": self.reps,
            "load_average": self.load_average,
        }


def measure_step_floor(
    draft: torch.nn.Module,
    target: torch.nn.Module,
    sampling: SamplingConfig,
    context: int,
    reps: int,
    seed: int = 0,
    lean: bool = False,
    layout: Mapping[str, Any] | None = None,
    *,
    decoding: Mapping[str, Any],
) -> StepFloor:
    """Time the floor, the draft's model-only and engine steps and the target's step at batch
    1 after `context` cached random tokens, interleaved in `reps` rounds; with `lean`, also
    the lean model-only step of a draft that has one; `layout`: the engine's runner settings
    (`decoding.builder.runner_layout`: static, compiled), the default layout without;
    `decoding`: the config's decoding section (`pack_every`, `prefill_tokens`: see
    `EngineDraftStep`)."""
    device = next(draft.parameters()).device
    vocab = min(int(draft.config.vocab_size), int(target.config.vocab_size))
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, vocab, (1, context + 1), generator=gen)
    cached, next_id = prefix[:, :context].to(device), prefix[:, context:].to(device)
    chain = MatmulChain(step_weights(draft), seed)
    model_step = ModelStep(draft, cached, next_id)
    target_step = ModelStep(target, cached, next_id)
    prompt = prefix[0, :context].tolist()
    engine_step = EngineDraftStep(draft, target, sampling, prompt, decoding, layout)
    steps = {"floor": chain, "model": model_step, "engine": engine_step, "target": target_step}
    resets = {"model": model_step.reset, "engine": engine_step.reset, "target": target_step.reset}
    if lean and supports_lean(draft):
        prefill_tokens = int(decoding_setting(decoding, "prefill_tokens"))
        steps["lean"] = lean_step = LeanStep(draft, cached, next_id, prefill_tokens)
        resets["lean"] = lean_step.reset
    before = load_average()
    med = interleaved_medians(steps, reps, device, resets=resets)
    return StepFloor(
        floor_ms=med["floor"] * 1e3,
        model_ms=med["model"] * 1e3,
        engine_ms=med["engine"] * 1e3,
        target_ms=med["target"] * 1e3,
        parameters=chain.parameters,
        matmuls=len(chain.weights),
        weight_bytes=chain.bytes,
        context_tokens=context,
        reps=reps,
        load_average={"start": before, "end": load_average()},
        lean_ms=med["lean"] * 1e3 if "lean" in med else None,
    )
