"""The target alone through Hugging Face's documented fast path: `generate` with a static KV
cache and, where `decoding.compile` says so, `torch.compile` of the forward.

`target_only` is our engine's one-token-a-call baseline; this is what a reader would get from
transformers itself on the same model (transformers' docs/source/en/llm_optims.md, "Static
kv-cache and torch.compile"). Things this transformers version (5.17-5.24) does that shape
the code:

- `generate` compiles the decode step by itself whenever the cache is a static one and the
  device is CUDA (`_valid_auto_compile_criteria`), with `CompileConfig`'s default
  `mode="reduce-overhead"` (CUDA graphs). So compile off must say `disable_compile=True`,
  and compile on a CPU needs the config's `_compile_all_devices` flag (a class attribute,
  not a constructor argument). The prefill runs eager; only the one-token steps compile.
- With `cache_implementation="static"` every call allocates a fresh cache sized to that
  call's prompt + budget: new tensor addresses each call re-record the CUDA graphs, and a
  longer prompt recompiles. One `StaticCache` of the bench's longest prompt + budget,
  `reset()` before each call (the docs' "pass a StaticCache"), keeps every call on the
  graphs the warm-up compiled.
- The cache is passed under the name the target's forward takes (`models/cache.py`): `cache`
  from 5.24 on, where `past_key_values` is deprecated (gone in 6.0), `past_key_values` on 5.17.
- A forward hook would be traced into the compiled graph, so calls are not hooked: HF's loop
  makes one prefill and one forward per later token, so the target calls are the tokens.
"""

from __future__ import annotations

import time

import torch
from transformers import CompileConfig, PreTrainedModel, StaticCache

from sprinter_train.bench.peers.hf_assisted import PeerRun, cut_after_eos, sampling_kwargs
from sprinter_train.core.runtime import synchronize
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.models.cache import with_cache


class StaticPeer:
    """The target's `generate` with one reused static cache, compiled or eager."""

    def __init__(
        self,
        target: PreTrainedModel,
        *,
        max_cache_len: int,
        compile: bool,
        compile_mode: str,
        device: torch.device,
    ) -> None:
        if max_cache_len < 2:
            raise ValueError(f"max_cache_len must be at least 2, got {max_cache_len}")
        self.target, self.device, self.compile = target, device, compile
        self.max_cache_len = max_cache_len
        self.cache = StaticCache(config=target.config, max_cache_len=max_cache_len)
        self.compile_config: CompileConfig | None = None
        if compile:
            self.compile_config = CompileConfig(fullgraph=True, mode=compile_mode)
            if device.type != "cuda":  # HF compiles on CUDA (and a few others) unless told
                self.compile_config._compile_all_devices = True

    def settings(self) -> dict[str, object]:
        """What results.json records of the peer."""
        mode = self.compile_config.mode if self.compile_config else None
        return {"compile": self.compile, "compile_mode": mode, "max_cache_len": self.max_cache_len}

    def warm_up(self, prompt_ids: list[int], max_new_tokens: int) -> float:
        """Seconds of one greedy generation that compiles the decode step (and, under
        `reduce-overhead`, records its CUDA graph): reported apart, never timed as speed."""
        run = self.run(
            prompt_ids,
            sampling=SamplingConfig(temperature=0.0),
            max_new_tokens=max(max_new_tokens, 4),  # CUDA graphs record on the third step
            seed=0,
            eos_token_id=None,
        )
        return run.wall_s

    def run(
        self,
        prompt_ids: list[int],
        *,
        sampling: SamplingConfig,
        max_new_tokens: int,
        seed: int,
        eos_token_id: int | None,
    ) -> PeerRun:
        """Generate after `prompt_ids`, timed with device synchronisation (`eos_token_id=None`:
        run to `max_new_tokens`)."""
        if len(prompt_ids) + max_new_tokens > self.max_cache_len:
            raise ValueError(
                f"prompt of {len(prompt_ids)} + {max_new_tokens} new tokens exceeds the static "
                f"cache's {self.max_cache_len}"
            )
        pad_token_id = self.target.generation_config.pad_token_id
        if pad_token_id is None:
            pad_token_id = eos_token_id
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        self.cache.reset()
        torch.manual_seed(seed)
        synchronize(self.device)
        start = time.perf_counter()
        output = self.target.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            compile_config=self.compile_config,
            disable_compile=not self.compile,
            **with_cache(self.target, self.cache),
            **sampling_kwargs(sampling),
        )
        synchronize(self.device)
        wall_s = time.perf_counter() - start
        tokens = cut_after_eos(output[0, input_ids.shape[1] :].tolist(), eos_token_id)
        return PeerRun(tokens=tokens, wall_s=wall_s, target_calls=len(tokens), draft_calls=0)
