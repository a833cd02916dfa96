"""The latency profile: the target's forward time by batch size and new tokens a row
(1..gamma_max + 1), and one step of the draft and companion by batch size, measured on the
machine at hand.

The default gamma reads it, and the engine's timings start from it (`priors`): on a CPU the
verify cost is far from a GPU's (where a forward over a few tokens a row costs about one), and
a forward over a few more tokens a row stops being nearly free once the batch fills the
device, so a gamma chosen for one device or batch size is wrong on another.

Batch 1 keeps its own fields (`target_ms`, `draft_ms`, `companion_ms`: draft_eval reads them);
larger batch sizes live in `batch_*` tables. Sizes between measured ones are interpolated
linearly, sizes past the largest extend the last measured slope (never downwards).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from sprinter_train.core.distributions import implied_speedup
from sprinter_train.core.io import corrupt_input, read_json_input, write_json
from sprinter_train.core.runtime import synchronize
from sprinter_train.decoding.runner.after_warp import AfterWarp, Check, Draw
from sprinter_train.decoding.runner.requests import ForwardRequest
from sprinter_train.models.cache import crop_cache, returned_cache, with_cache


def piecewise_linear(points: dict[int, float], x: float) -> float:
    """The value at x of the line through `points` (sorted by key): interpolated between two
    keys, the first value below the first key, the last segment's slope (floored at 0: a
    bigger forward is never faster) past the last key."""
    keys = sorted(points)
    if x in points:
        return points[x]
    if x <= keys[0]:
        return points[keys[0]]
    for lo, hi in zip(keys, keys[1:], strict=False):
        if x < hi:
            return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)
    if len(keys) == 1:
        return points[keys[0]]
    lo, hi = keys[-2], keys[-1]
    slope = max(0.0, (points[hi] - points[lo]) / (hi - lo))
    return points[hi] + slope * (x - hi)


@dataclass
class LatencyProfile:
    target_ms: dict[int, float]  # batch 1: new tokens -> median milliseconds of one forward
    draft_ms: float  # batch 1: one draft step
    companion_ms: float | None
    context_tokens: int
    device: str
    dtype: str
    batch_target_ms: dict[int, dict[int, float]] = field(default_factory=dict)  # size > 1
    batch_draft_ms: dict[int, float] = field(default_factory=dict)
    batch_companion_ms: dict[int, float] = field(default_factory=dict)
    # the 1-minute load average before and after measuring (start, end) and the cores other
    # processes kept busy then (busy_start, busy_end); None: not recorded
    load_average: dict[str, float | None] | None = None
    # role -> model_identity of the models it timed (None: not recorded); a profile of other
    # models (another draft, no companion) is never reused
    models: dict[str, Any] | None = None
    # what beside the models sets a forward's cost (torch version, threads, prepacked linears
    # per role: `bench.prepare.timed_kernels`); a profile of other kernels is never reused
    # (None: not recorded)
    kernels: dict[str, Any] | None = None

    @property
    def measured_under_load(self) -> bool:
        """Taken beside other work (load above the core count), or with no load recorded:
        such timings pick the wrong gamma on a quiet machine, so they are never reused."""
        from sprinter_train.bench.run.provenance import ran_under_load  # see `profile_models`

        if not self.load_average:
            return True
        load = self.load_average
        return ran_under_load(
            load.get("busy_start"),
            load.get("start"),
            load.get("busy_end"),
            load.get("end"),
            torch.get_num_threads(),  # the profiler's own, counted in the end load
        )

    @property
    def batch_sizes(self) -> list[int]:
        """The batch sizes measured (1 always)."""
        return sorted({1, *self.batch_target_ms})

    def target_table(self, batch_size: int) -> dict[int, float]:
        """New tokens a row -> milliseconds, at a measured batch size."""
        return self.target_ms if batch_size == 1 else self.batch_target_ms[batch_size]

    def covers(self, batch_sizes: Sequence[int], new_tokens: int) -> bool:
        """Whether every batch size was measured with 1..new_tokens tokens a row."""
        wanted = set(range(1, new_tokens + 1))
        return all(
            b in self.batch_sizes and wanted <= set(self.target_table(b)) for b in batch_sizes
        )

    def target_batch_s(self, batch_size: int, new_tokens: int) -> float:
        """Seconds for a target forward over `new_tokens` a row at this batch size."""
        by_size = {b: piecewise_linear(self.target_table(b), new_tokens) for b in self.batch_sizes}
        return piecewise_linear(by_size, batch_size) / 1e3

    def draft_batch_ms(self, batch_size: int) -> float:
        return piecewise_linear({1: self.draft_ms, **self.batch_draft_ms}, batch_size)

    def companion_batch_ms(self, batch_size: int) -> float:
        if self.companion_ms is None:
            return 0.0
        return piecewise_linear({1: self.companion_ms, **self.batch_companion_ms}, batch_size)

    def priors(self) -> dict[str, Callable[..., float]]:
        """The engine's timings start from these (`Timings.set_priors`): the target's forward
        by (batch size, tokens a row) and each draft-side model's step by batch size, seconds."""
        return {
            "target": self.target_batch_s,
            "draft": lambda batch_size: self.draft_batch_ms(batch_size) / 1e3,
            "companion": lambda batch_size: self.companion_batch_ms(batch_size) / 1e3,
        }

    def draft_step_s(self, batch_size: int) -> float:
        """Seconds for one drafting step (draft and companion) at this batch size."""
        return (self.draft_batch_ms(batch_size) + self.companion_batch_ms(batch_size)) / 1e3

    def target_s(self, new_tokens: int) -> float:
        """Seconds for a batch-1 target forward over `new_tokens` (extrapolated past the top)."""
        return self.target_batch_s(1, new_tokens)

    def sd_round_s(self, gamma: int) -> float:
        return gamma * self.draft_ms / 1e3 + self.target_s(gamma + 1)

    def sv_round_s(self, gamma: int) -> float:
        return gamma * self.draft_step_s(1) + self.target_s(gamma + 1)

    def c_at(self, batch_size: int) -> float:
        """Leviathan's c at this batch size: a draft step over a one-token target forward."""
        return self.draft_batch_ms(batch_size) / 1e3 / self.target_batch_s(batch_size, 1)

    @property
    def c(self) -> float:
        return self.c_at(1)

    def verify_cost(self, gamma: int, batch_size: int = 1) -> float:
        """The target's forward over gamma + 1 tokens a row, in one-token forwards."""
        return self.target_batch_s(batch_size, gamma + 1) / self.target_batch_s(batch_size, 1)

    def best_gamma(self, alpha: float, gammas: range, batch_size: int = 1) -> int:
        """The gamma maximising Leviathan's implied speedup at acceptance rate alpha, with this
        batch size's c and verify cost."""
        c = self.c_at(batch_size)
        return max(
            gammas,
            key=lambda g: implied_speedup(alpha, g, c, self.verify_cost(g, batch_size)),
        )

    def by_batch(self, batch_sizes: Sequence[int], new_tokens: int) -> dict[str, dict[str, Any]]:
        """What results.json shows of the profile: per batch size, ms of a target forward over
        1..new_tokens tokens a row and of a draft and companion step (read as the run reads
        them, interpolated where not measured), keyed by strings at every level, as JSON
        keeps them, so the run's own results and a read-back file look alike."""
        return {
            str(b): {
                "target_ms": {
                    str(n): 1e3 * self.target_batch_s(b, n) for n in range(1, new_tokens + 1)
                },
                "draft_ms": self.draft_batch_ms(b),
                "companion_ms": self.companion_batch_ms(b)
                if self.companion_ms is not None
                else None,
            }
            for b in batch_sizes
        }

    def save(self, path: Path) -> None:
        write_json(path, asdict(self))

    @classmethod
    def load(cls, path: Path) -> LatencyProfile:
        """A saved profile; one written before batch sizes were profiled loads as batch 1 only.
        A truncated or foreign file is refused naming it and how to measure it again."""
        remedy = f"delete it and rerun stage=bench, which measures a new profile at {path}"
        payload = read_json_input(path, remedy, ("target_ms", "draft_ms", "device", "dtype"))
        try:
            return cls.from_json(payload)
        except (TypeError, ValueError, AttributeError) as error:
            raise corrupt_input(path, error, remedy) from error

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> LatencyProfile:
        """The profile a latency.json holds (its JSON object, keys as strings)."""
        data = dict(payload)
        data["target_ms"] = {int(k): float(v) for k, v in data["target_ms"].items()}
        data["batch_target_ms"] = {
            int(b): {int(k): float(v) for k, v in per.items()}
            for b, per in data.get("batch_target_ms", {}).items()
        }
        for key in ("batch_draft_ms", "batch_companion_ms"):
            data[key] = {int(b): float(v) for b, v in data.get(key, {}).items()}
        return cls(**data)


def interleaved_medians(
    timed: Callable[[str, int, int], float],
    new_tokens: dict[str, list[int]],
    reps: int,
    batch_sizes: Sequence[int],
) -> dict[str, dict[int, dict[int, float]]]:
    """Median of `reps` `timed(name, batch size, n)` calls for every name's n at every batch
    size, in interleaved rounds (every size of every model once a round) so machine noise hits
    all alike; three warm-up rounds (allocator, kernels, any compilation) are discarded."""
    times = {name: {b: {n: [] for n in ns} for b in batch_sizes} for name, ns in new_tokens.items()}
    for rep in range(reps + 3):
        for b in batch_sizes:
            for name, ns in new_tokens.items():
                for n in ns:
                    elapsed = timed(name, b, n)
                    if rep >= 3:
                        times[name][b][n].append(elapsed)
    return {
        name: {b: {n: statistics.median(v) for n, v in per_n.items()} for b, per_n in per.items()}
        for name, per in times.items()
    }


@torch.inference_mode()
def measure_step_times(
    models: dict[str, torch.nn.Module],
    new_tokens: dict[str, list[int]],
    reps: int,
    context: int,
    device: torch.device,
    batch_sizes: Sequence[int] = (1,),
) -> dict[str, dict[int, dict[int, float]]]:
    """Median seconds of a KV-cached forward over n new tokens a row after `context` cached
    ones, per model, batch size and n: {model: {batch size: {n: seconds}}}. Measured in
    interleaved rounds (every size of every model once a round) so machine noise hits all
    alike; three warm-up rounds are discarded."""
    vocab = min(int(m.config.vocab_size) for m in models.values())
    gen = torch.Generator().manual_seed(0)
    caches: dict[tuple[str, int], Any] = {}
    for b in batch_sizes:
        prefix = torch.randint(0, vocab, (b, context), generator=gen).to(device)
        for name, model in models.items():
            caches[name, b] = returned_cache(model(input_ids=prefix, use_cache=True))

    def timed(name: str, b: int, n: int) -> float:
        ids = torch.randint(0, vocab, (b, n), generator=gen).to(device)
        synchronize(device)
        start = time.perf_counter()
        model = models[name]
        model(input_ids=ids, use_cache=True, logits_to_keep=n, **with_cache(model, caches[name, b]))
        synchronize(device)
        elapsed = time.perf_counter() - start
        crop_cache(caches[name, b], context)
        return elapsed

    return interleaved_medians(timed, new_tokens, reps, batch_sizes)


def engine_then(
    role: str, tokens: int, rows: int, vocab: int, gen: torch.Generator, device: torch.device
) -> AfterWarp | None:
    """What the engine does after the warp of a forward of `role` over `tokens` tokens a row
    (`after_warp`; in the graph of a captured runner), on random inputs of its shapes: a
    draw at every draft step and at the target's forward of one token (a round without
    drafts), a speculative check of `tokens - 1` drafts at the target's wider forwards."""
    if role not in ("draft", "target"):
        return None

    def uniforms(n: int) -> torch.Tensor:
        return torch.rand((rows, n), generator=gen, dtype=torch.float64).to(device)

    if role == "draft" or tokens == 1:
        return Draw(uniforms(1)[:, 0])
    drafted = tokens - 1
    q = torch.rand((rows, drafted, vocab), generator=gen)
    drafts = torch.randint(0, vocab, (rows, drafted), generator=gen)
    counts = torch.full((rows,), drafted)
    check = (q / q.sum(-1, keepdim=True), drafts, counts)
    return Check(*(t.to(device) for t in check), uniforms(tokens))


@torch.inference_mode()
def measure_runner_times(
    runners: dict[str, Any],
    new_tokens: dict[str, list[int]],
    reps: int,
    context: int,
    device: torch.device,
    batch_sizes: Sequence[int] = (1,),
    warp: Any = None,
) -> dict[str, dict[int, dict[int, float]]]:
    """`measure_step_times` through the engine's own `ModelRunner`s (decoding/runner/runner.py): the
    forward a round runs, in its layout (lean, static, compiled), with the head applied
    where a round applies it and the logits warped by `warp` (the engine's sampling) and
    what the engine then does (`engine_then`: a draw or a speculative check), which a
    captured runner does in its graph: the same graphs the engine then replays. A compiled
    runner's shapes compile in the warm-up rounds. The runners' forward timings are drained
    after, so the engine's `Timings` learn from the run's own forwards only."""
    vocab = min(int(r.vocab_size) for r in runners.values())
    gen = torch.Generator().manual_seed(0)
    caches: dict[tuple[str, int], Any] = {}
    for b in batch_sizes:
        prefix = torch.randint(0, vocab, (b, context), generator=gen).tolist()
        for name, runner in runners.items():
            caches[name, b] = runner.new_cache(b, context + max(new_tokens[name]) + 16)
            runner.prime(caches[name, b], prefix)
    held = {b: torch.full((b,), context, device=device) for b in batch_sizes}

    def timed(name: str, b: int, n: int) -> float:
        runner, cache = runners[name], caches[name, b]
        ids = torch.randint(0, vocab, (b, n), generator=gen).to(device)
        counts = torch.full((b,), n, device=device)
        keep = torch.arange(n, device=device).expand(b, -1)
        then = None
        if warp is not None:
            then = engine_then(name, n, b, int(runner.vocab_size), gen, device)
        synchronize(device)
        start = time.perf_counter()
        runner.run(cache, ForwardRequest(ids, counts, keep, runner.support is not None, warp, then))
        synchronize(device)
        elapsed = time.perf_counter() - start
        cache.truncate(held[b], context)
        cache.pack(context, context)
        return elapsed

    medians = interleaved_medians(timed, new_tokens, reps, batch_sizes)
    for runner in runners.values():
        runner.forward_times()
    return medians


def profile_models(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    companion: torch.nn.Module | None,
    gamma_max: int,
    reps: int,
    context: int,
    device: torch.device,
    batch_sizes: Sequence[int] = (1,),
    runners: dict[str, Any] | None = None,
    warp: Any = None,
) -> LatencyProfile:
    """Measure the profile at batch 1 and at every one of `batch_sizes`: through the
    engine's `runners` (role -> ModelRunner) when given, with the engine's sampling `warp`,
    else raw Hugging Face forwards over a DynamicCache (draft_eval's measure of the models
    themselves).

    Provenance's machine readings are imported here, not at the top: an export folder copies
    this module to read a profile (stage=export), and provenance's imports (omegaconf, the
    harvest's) are not among the folder's requirements."""
    from sprinter_train.bench.run.provenance import busy_cores, load_average

    sizes_b = sorted({1, *(int(b) for b in batch_sizes)})
    models: dict[str, Any] = {"target": target, "draft": draft}
    sizes = {"target": list(range(1, gamma_max + 2)), "draft": [1]}
    if companion is not None:
        models["companion"], sizes["companion"] = companion, [1]
    load_before, busy_before = load_average(), busy_cores()
    if runners is None:
        med = measure_step_times(models, sizes, reps, context, device, sizes_b)
    else:
        chosen = {name: runners[name] for name in models}
        med = measure_runner_times(chosen, sizes, reps, context, device, sizes_b, warp)

    def ms(name: str, b: int) -> dict[int, float]:
        return {n: s * 1e3 for n, s in med[name][b].items()}

    larger = [b for b in sizes_b if b > 1]
    return LatencyProfile(
        target_ms=ms("target", 1),
        draft_ms=ms("draft", 1)[1],
        companion_ms=ms("companion", 1)[1] if companion is not None else None,
        context_tokens=context,
        device=str(device),
        dtype=str(next(target.parameters()).dtype).removeprefix("torch."),
        batch_target_ms={b: ms("target", b) for b in larger},
        batch_draft_ms={b: ms("draft", b)[1] for b in larger},
        batch_companion_ms={b: ms("companion", b)[1] for b in larger}
        if companion is not None
        else {},
        load_average={
            "start": load_before,
            "end": load_average(),
            "busy_start": busy_before,
            "busy_end": busy_cores(),
        },
    )
