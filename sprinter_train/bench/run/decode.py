"""Every method on every group of prompts at every batch size, side by side."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from omegaconf import DictConfig

from sprinter_train.bench.peers.hf_assisted import PeerRun, run_hf_assisted
from sprinter_train.bench.peers.hf_static import StaticPeer
from sprinter_train.bench.run.methods import HF_STATIC, at_batch_size
from sprinter_train.bench.run.phases import phase, runner_compile_seconds
from sprinter_train.bench.run.prepare import Setup
from sprinter_train.bench.run.runs import Decoded, GroupRun, engine_decode, run_methods
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.batch import DecodeStats

WarmUps = dict[int, dict[str, float]]  # batch size -> method -> warm-up seconds


def static_peer(cfg: DictConfig, setup: Setup) -> StaticPeer | None:
    """hf_static's generator, its one static cache sized to the longest prompt + budget (so
    no prompt re-allocates it or recompiles); None when the bench does not run it."""
    if HF_STATIC not in setup.plan.peers:
        return None
    longest = max(len(p.input_ids) for p in setup.prompts)
    return StaticPeer(
        setup.models.target.model,
        max_cache_len=longest + int(cfg.bench.max_new_tokens),
        device=setup.device,
        **setup.plan.peers[HF_STATIC],
    )


def decode_all(
    cfg: DictConfig,
    setup: Setup,
    warmups: WarmUps | None = None,
    after_size: Callable[[dict[int, dict[str, list[GroupRun]]]], None] | None = None,
) -> dict[int, dict[str, list[GroupRun]]]:
    """Every method on every group of prompts at every batch size, side by side (HF's peers
    at batch 1 only: they decode one sequence); each method's warm-up seconds per batch size
    go into `warmups` when given, and `after_size` sees the runs so far after each batch size
    but the last (a run cut short keeps what it measured)."""
    b, plan, models = cfg.bench, setup.plan, setup.models
    static = static_peer(cfg, setup)
    if static is not None and static.compile:  # compiled before any run, whatever warmup_runs
        first = setup.prompts[0].input_ids
        with phase(setup.phases, "hf_static compile"):  # HF's own torch.compile: dynamo's tally
            plan.settings[HF_STATIC]["compile_s"] = static.warm_up(first, int(b.max_new_tokens))
    on_runners = runner_compile_seconds(setup.engine)

    def decode_peer(name: str, group: list[Prompt], seeds: list[int]) -> Decoded:
        (prompt,), (seed,) = group, seeds
        common = {
            "sampling": setup.engine.sampling,
            "max_new_tokens": int(b.max_new_tokens),
            "seed": seed,
            "eos_token_id": models.eos_token_id,
        }
        peer: PeerRun
        if name == HF_STATIC and static is not None:
            peer = static.run(prompt.input_ids, **common)
        else:
            peer = run_hf_assisted(
                models.target.model,
                models.draft.model,
                prompt.input_ids,
                device=setup.device,
                **common,
                **plan.peers[name],
            )
        stats = DecodeStats(target_calls=peer.target_calls, draft_calls=peer.draft_calls)
        return [peer.tokens], peer.wall_s, stats

    runs: dict[int, dict[str, list[GroupRun]]] = {}
    for size in setup.batch_sizes:
        sized = at_batch_size(plan, cfg, setup.gammas[size])
        on_engine = engine_decode(setup.engine, sized.policies, int(b.max_new_tokens))

        def decode(name: str, group: list[Prompt], seeds: list[int], on_engine=on_engine):
            return (decode_peer if name in plan.peers else on_engine)(name, group, seeds)

        def warm_up(name: str, size: int = size) -> AbstractContextManager[None]:
            """A method's warm-up as a set-up phase: a peer's compiles are HF's (dynamo's own
            tally), the engine's its runners' (their captures included)."""
            measure = {} if name in plan.peers else {"compile_seconds": on_runners}
            return phase(setup.phases, "warm-up", method=name, batch_size=size, **measure)

        seconds: dict[str, float] = {}
        runs[size] = run_methods(
            decode,
            [n for n in setup.names if size == 1 or n not in plan.peers],
            setup.prompts,
            size,
            int(b.seed),
            int(b.warmup_runs),
            setup.device if b.energy and size == 1 else None,
            int(b.min_timed_runs),
            seconds,
            warm_up,
        )
        if warmups is not None:
            warmups[size] = seconds
        if after_size is not None and size != setup.batch_sizes[-1]:
            after_size(runs)
    return runs
