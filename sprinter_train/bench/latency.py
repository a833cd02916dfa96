"""The latency profile: the target's forward time for 1..gamma_max + 1 new tokens, and one
step of the draft and companion, measured on the machine at hand.

SV's goodput and the default gamma read it: on a CPU the verify cost is far from a GPU's
(flat in bfloat16 up to ~8 tokens here, 1.6-2x a step in float32), so a gamma chosen for one
device is wrong on another.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from sprinter_train.core.distributions import implied_speedup
from sprinter_train.core.io import read_json, write_json
from sprinter_train.core.runtime import synchronize
from sprinter_train.models.cache import crop_cache


@dataclass
class LatencyProfile:
    target_ms: dict[int, float]  # new tokens fed -> median milliseconds of one forward
    draft_ms: float
    companion_ms: float | None
    context_tokens: int
    device: str
    dtype: str

    def target_s(self, new_tokens: int) -> float:
        """Seconds for a target forward over `new_tokens`, extrapolated linearly past the top."""
        sizes = sorted(self.target_ms)
        if new_tokens in self.target_ms:
            return self.target_ms[new_tokens] / 1e3
        top, below = sizes[-1], sizes[-2] if len(sizes) > 1 else sizes[-1]
        slope = (self.target_ms[top] - self.target_ms[below]) / max(top - below, 1)
        return (self.target_ms[top] + slope * (new_tokens - top)) / 1e3

    def sd_round_s(self, gamma: int) -> float:
        return gamma * self.draft_ms / 1e3 + self.target_s(gamma + 1)

    def sv_round_s(self, gamma: int) -> float:
        return gamma * self.draft_step_s(1) + self.target_s(gamma + 1)

    def target_batch_s(self, batch_size: int, new_tokens: int) -> float:
        """Seconds for a target forward over `new_tokens` a row at this batch size."""
        return self.target_s(new_tokens)

    def draft_step_s(self, batch_size: int) -> float:
        """Seconds for one drafting step (draft and companion) at this batch size."""
        return (self.draft_ms + (self.companion_ms or 0.0)) / 1e3

    @property
    def c(self) -> float:
        return self.draft_ms / self.target_ms[1]

    def verify_cost(self, gamma: int) -> float:
        return self.target_s(gamma + 1) * 1e3 / self.target_ms[1]

    def best_gamma(self, alpha: float, gammas: range) -> int:
        """The gamma maximising Leviathan's implied speedup at acceptance rate alpha."""
        return max(gammas, key=lambda g: implied_speedup(alpha, g, self.c, self.verify_cost(g)))

    def save(self, path: Path) -> None:
        write_json(path, asdict(self))

    @classmethod
    def load(cls, path: Path) -> LatencyProfile:
        data = read_json(path)
        data["target_ms"] = {int(k): float(v) for k, v in data["target_ms"].items()}
        return cls(**data)


@torch.inference_mode()
def measure_step_times(
    models: dict[str, torch.nn.Module],
    new_tokens: dict[str, list[int]],
    reps: int,
    context: int,
    device: torch.device,
) -> dict[str, dict[int, float]]:
    """Median seconds of a KV-cached forward over n new tokens after `context` cached ones,
    per model and n, measured in interleaved rounds so machine noise hits all alike."""
    vocab = min(int(m.config.vocab_size) for m in models.values())
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, context), generator=gen).to(device)
    caches = {
        name: m(input_ids=prefix, use_cache=True).past_key_values for name, m in models.items()
    }
    times: dict[str, dict[int, list[float]]] = {n: {k: [] for k in new_tokens[n]} for n in models}

    def timed(name: str, n: int) -> float:
        ids = torch.randint(0, vocab, (1, n), generator=gen).to(device)
        synchronize(device)
        start = time.perf_counter()
        models[name](input_ids=ids, past_key_values=caches[name], use_cache=True, logits_to_keep=n)
        synchronize(device)
        elapsed = time.perf_counter() - start
        crop_cache(caches[name], context)
        return elapsed

    for rep in range(reps + 3):  # three warm-up rounds
        for name in models:
            for n in new_tokens[name]:
                elapsed = timed(name, n)
                if rep >= 3:
                    times[name][n].append(elapsed)
    return {name: {n: statistics.median(v) for n, v in per.items()} for name, per in times.items()}


def profile_models(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    companion: torch.nn.Module | None,
    gamma_max: int,
    reps: int,
    context: int,
    device: torch.device,
) -> LatencyProfile:
    models: dict[str, Any] = {"target": target, "draft": draft}
    sizes = {"target": list(range(1, gamma_max + 2)), "draft": [1]}
    if companion is not None:
        models["companion"], sizes["companion"] = companion, [1]
    med = measure_step_times(models, sizes, reps, context, device)
    return LatencyProfile(
        target_ms={n: s * 1e3 for n, s in med["target"].items()},
        draft_ms=med["draft"][1] * 1e3,
        companion_ms=med["companion"][1] * 1e3 if companion is not None else None,
        context_tokens=context,
        device=str(device),
        dtype=str(next(target.parameters()).dtype).removeprefix("torch."),
    )
