"""The peer our engine is compared with: Hugging Face assisted generation.

`target.generate(..., assistant_model=draft)` is the speculative decoder most readers know, so
the benchmark reports it beside ours under the same prompt, sampling and token budget.

Things this transformers version (5.x) does that shape the code below:

- The drafting knobs (`num_assistant_tokens`, `num_assistant_tokens_schedule`,
  `assistant_confidence_threshold`) are read from `draft.generation_config`, not from the
  `generate()` kwargs or the target's config; kwargs given to the target are silently ignored.
  So the draft gets a throwaway config for the call and its own comes back in `finally`.
- The "heuristic" schedule writes the final `num_assistant_tokens` back into the draft's
  config; restoring the config makes every call start from the same value (reproducible runs).
- The global default `assistant_confidence_threshold` is 0.4, and with scikit-learn installed
  it is re-fitted every round; both stop drafting early, so it is set to 0 (off).
- The restricted-head draft's -inf logits need no patching: HF warps them (temperature, top-k,
  top-p all keep -inf as -inf), softmax turns them into q = 0, and a token with q = 0 is never
  drafted, so the ratio p/q in `_speculative_sampling` never divides by zero. Verified by the
  tests over several temperatures, top-k and top-p values.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedModel

from sprinter_train.core.runtime import synchronize
from sprinter_train.core.sampling import SamplingConfig

SCHEDULES = ("constant", "heuristic")


@dataclass
class PeerRun:
    """One assisted generation: new tokens (cut after the first EOS), time and forward calls."""

    tokens: list[int]
    wall_s: float
    target_calls: int
    draft_calls: int


def sampling_kwargs(sampling: SamplingConfig) -> dict[str, object]:
    """`generate()` kwargs for the same warping as `warp_probs`.

    top_k is always passed: HF's global default is 50, which `warp_probs` does not apply.
    """
    if sampling.greedy:
        return {"do_sample": False}
    return {
        "do_sample": True,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
    }


def _draft_config(
    schedule: str, num_assistant_tokens: int, eos_token_id: int | None, pad_token_id: int | None
) -> GenerationConfig:
    """A fresh config so the draft checkpoint's own generation settings cannot leak in.

    eos is the caller's: HF fills unset fields of the draft's per-round config from this one,
    so with `eos_token_id=None` the draft checkpoint's EOS would come back and end rounds early
    (the output stays the target's, but `draft_calls` would be skewed).
    """
    return GenerationConfig(
        num_assistant_tokens=num_assistant_tokens,
        num_assistant_tokens_schedule=schedule,
        assistant_confidence_threshold=0.0,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )


def cut_after_eos(tokens: list[int], eos_token_id: int | None) -> list[int]:
    if eos_token_id is not None and eos_token_id in tokens:
        return tokens[: tokens.index(eos_token_id) + 1]
    return tokens


class _CallCounter:
    """Counts forward calls of one module through a hook, removed by `close()`."""

    def __init__(self, module: nn.Module):
        self.calls = 0
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, *_: object) -> None:
        self.calls += 1

    def close(self) -> None:
        self._handle.remove()


def run_hf_assisted(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompt_ids: list[int],
    *,
    sampling: SamplingConfig,
    max_new_tokens: int,
    schedule: str,
    num_assistant_tokens: int,
    seed: int,
    eos_token_id: int | None,
    device: torch.device,
) -> PeerRun:
    """Generate after `prompt_ids` with HF assisted generation, timing it and counting calls.

    `eos_token_id=None` means no stop on EOS (generation runs to `max_new_tokens`). The draft
    must be a separate module from the target (a copy is fine): one forward hook cannot tell
    whose call it is counting.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if num_assistant_tokens < 1:
        raise ValueError(f"num_assistant_tokens must be at least 1, got {num_assistant_tokens}")
    if draft is target:
        raise ValueError("draft and target are the same module; pass a copy as the draft")
    pad_token_id = target.generation_config.pad_token_id
    if pad_token_id is None:
        pad_token_id = eos_token_id
    input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    own_config = draft.generation_config
    draft.generation_config = _draft_config(
        schedule, num_assistant_tokens, eos_token_id, pad_token_id
    )
    target_counter = _CallCounter(target)
    draft_counter = _CallCounter(draft)
    try:
        torch.manual_seed(seed)
        synchronize(device)
        start = time.perf_counter()
        output = target.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            assistant_model=draft,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            **sampling_kwargs(sampling),
        )
        synchronize(device)
        wall_s = time.perf_counter() - start
    finally:
        target_counter.close()
        draft_counter.close()
        draft.generation_config = own_config
    tokens = output[0, input_ids.shape[1] :].tolist()
    return PeerRun(
        tokens=cut_after_eos(tokens, eos_token_id),
        wall_s=wall_s,
        target_calls=target_counter.calls,
        draft_calls=draft_counter.calls,
    )
