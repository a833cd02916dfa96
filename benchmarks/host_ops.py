"""Count the device ops the engine dispatches outside the models' bodies, per method.

On a GPU the compiled body of a forward replays as one CUDA graph, and what is left of a
round is the engine's own work: sampling, acceptance, the caches' bookkeeping, each op one
kernel launch with its own host time. The GPU bench's `other` column put that work above
the compiled forwards themselves (docs/results/gpu.md has the figures). This counts those
ops on the CPU, with tiny models, so a change to the engine can be judged without a GPU:

    python benchmarks/host_ops.py            # target_only, sd (gamma 3), svip
    python benchmarks/host_ops.py --tokens 128
    python benchmarks/host_ops.py --captured # the GPU's layout: forwards from captured graphs
    python benchmarks/host_ops.py --captured --learned  # also sd_learned and sprinter

Ops are counted with a TorchDispatchMode (views included: they cost host time, no launch);
the body of every static-layout forward (the static backend's `step`, what a GPU compiles and
replays) is not counted. `--captured` plays the GPU's hand-captured graphs on the host
(`graphs.HostGraph`): what a graph replays is not counted, its input copies are, and each
replay counts as one op (its launch). `steady` is the ops a round after the first: the first
round holds the generation's set-up and the prompts' eager prefill, paid once a generation.
`--learned` adds sd_learned and sprinter, each scoring with a linear verifier (seeded weights)
on `train.features`, the default feature set: their verifier's ops are its own column.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from unittest.mock import patch

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sprinter_train.core.config import compose_config  # noqa: E402
from sprinter_train.core.sampling import SamplingConfig  # noqa: E402
from sprinter_train.decoding.builder import build_engine  # noqa: E402
from sprinter_train.decoding.engine import Engine  # noqa: E402
from sprinter_train.decoding.policies import (  # noqa: E402
    SVIP,
    LearnedLength,
    SpeculativeDecoding,
    Sprinter,
    TargetOnly,
)
from sprinter_train.decoding.runner import capture as graphs  # noqa: E402
from sprinter_train.decoding.runner.capture import HostGraph  # noqa: E402
from sprinter_train.decoding.timings import Timings  # noqa: E402
from sprinter_train.models.tiny import build_tiny_model  # noqa: E402
from sprinter_train.verifier.scorer import CheckpointVerifier  # noqa: E402
from tests.sd_learned_helpers import linear_verifier  # noqa: E402


class OpCounter(TorchDispatchMode):
    """Counts aten ops by name while `counting` is on."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.counting = True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        if self.counting:
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def gpu_target_seconds(rows: int, tokens: int) -> float:
    """A target forward's price on a GPU at batch 1: a one-token step and a price per further
    token, as the GPU latency profile in docs/results/gpu.md puts them."""
    return 1.9e-3 + 0.2e-3 * (tokens - 1)


def default_verifier(draft: torch.nn.Module) -> CheckpointVerifier:
    """A linear verifier on the default `train.features` of this draft, seeded weights small
    enough that its scores fall either side of 0.5: what sd_learned and sprinter score with,
    counted as they run it."""
    train = compose_config("stage=train").train
    return linear_verifier(draft, list(train.features), 0.1, dict(train.feature_settings))


def count(
    engine: Engine, policy: Any, prompt: list[int], tokens: int
) -> tuple[Counter, Any, float]:
    """The ops outside the bodies of one generation, its stats (after a warm-up one), and
    its ops a round after the first (`steady`: the first holds the generation's set-up and
    the prompts' prefill, paid once a generation, not once a round)."""
    engine.generate([prompt], policy, tokens)
    counter = OpCounter()
    first: list[int] = []
    commit = engine.commit

    def commit_marked(*args: Any, **kwargs: Any) -> Any:
        done = commit(*args, **kwargs)
        if not first:  # the first round's ops, and the replays so far
            first.extend((sum(counter.ops.values()), HostGraph.replays))
        return done

    def uncounted(step: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            was, counter.counting = counter.counting, False
            try:
                return step(*args, **kwargs)
            finally:
                counter.counting = was  # a captured step holds the body's: nested

        return run

    # what a GPU runs inside its graphs is not counted: the bodies, a captured forward, and a
    # replay (one launch, counted below)
    with ExitStack() as uncounting:
        for runner in engine.present_runners.values():
            static = getattr(runner.backend, "static", runner.backend)  # a capture's inner one
            uncounting.enter_context(patch.object(static, "step", uncounted(static.step)))
            if runner.graphs is not None:
                graphs_of = runner.graphs
                uncounting.enter_context(patch.object(graphs_of, "step", uncounted(graphs_of.step)))
        uncounting.enter_context(patch.object(HostGraph, "replay", uncounted(HostGraph.replay)))
        uncounting.enter_context(patch.object(engine, "commit", commit_marked))
        replays = HostGraph.replays
        with counter:
            result = engine.generate([prompt], policy, tokens)[0]
    later = sum(counter.ops.values()) - first[0] + HostGraph.replays - first[1]
    if HostGraph.replays > replays:
        counter.ops["graph replay"] += HostGraph.replays - replays
    steady = later / max(result.stats.rounds - 1, 1)
    return counter.ops, result.stats, steady


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=64, help="new tokens of the generation")
    parser.add_argument("--top", type=int, default=8, help="most frequent ops listed")
    parser.add_argument("--captured", action="store_true", help="the GPU's captured layout")
    parser.add_argument("--learned", action="store_true", help="sd_learned and sprinter too")
    args = parser.parse_args()
    if args.captured:
        graphs.CudaGraph = HostGraph  # the GPU's graphs, played on the host
    torch.manual_seed(0)
    target = build_tiny_model({}, seed=0).eval()
    draft = build_tiny_model({}, seed=0).eval()  # a copy: drafts get accepted, rounds run long
    sampling = SamplingConfig(temperature=0.9, top_k=0, top_p=0.95)
    vocab = int(target.config.vocab_size)
    decoding = compose_config().decoding  # pack_every, prefill_tokens: conf/config.yaml's
    layout = {
        "static": True,
        "min_capacity": 256,
        "captured": args.captured,
        "prefill_tokens": int(decoding.prefill_tokens),
    }
    # a fixed price, as a GPU's profile reads (ms): sd_learned's lengths depend on it, not on
    # the host's own timings of the tiny models
    timings = Timings(target=gpu_target_seconds, draft=lambda rows: 0.6e-3, learn=False)
    engine = build_engine(
        target,
        sampling,
        vocab,
        draft=draft,
        layout=layout,
        pack_every=int(decoding.pack_every),
        timings=timings,
    )
    prompt = [5, 17, 9, 33, 2, 8]
    policies: list[Any] = [TargetOnly(), SpeculativeDecoding(gamma=3), SVIP(0.25, 4, 0.15)]
    if args.learned:
        verifier = default_verifier(draft)
        policies += [LearnedLength(verifier, None, 4), Sprinter(verifier, 0.5, 4)]
    print("method        ops/round  steady  target calls  draft calls  ops/forward  most frequent")
    for policy in policies:
        ops, stats, steady = count(engine, policy, prompt, args.tokens)
        total = sum(ops.values())
        forwards = stats.target_calls + stats.draft_calls
        top = ", ".join(f"{name} {n}" for name, n in ops.most_common(args.top))
        print(
            f"{policy.name:<13} {total / max(stats.rounds, 1):9.1f}  {steady:6.1f}"
            f"  {stats.target_calls:12d}  {stats.draft_calls:11d}  {total / forwards:11.1f}  {top}"
        )


if __name__ == "__main__":
    main()
