"""Every method on every group of prompts at every batch size, side by side; vLLM's peers
each in a process of their own first, over every batch size at once."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from omegaconf import DictConfig

from sprinter_train.bench.peers import vllm_peer
from sprinter_train.bench.peers.hf_assisted import PeerRun, run_hf_assisted
from sprinter_train.bench.peers.hf_static import StaticPeer
from sprinter_train.bench.run.methods import HF_STATIC, at_batch_size
from sprinter_train.bench.run.phases import phase, runner_compile_seconds
from sprinter_train.bench.run.prepare import Setup
from sprinter_train.bench.run.runs import Decoded, GroupRun, engine_decode, run_methods
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.batch import DecodeStats

log = logging.getLogger(__name__)

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


def vllm_runs(cfg: DictConfig, setup: Setup) -> dict[str, dict[int, list[GroupRun]]]:
    """Each vLLM peer of the plan on the bench's prompts at every batch size, in a process of
    its own under the bench's threads (bench/peers/vllm_peer.py): method -> batch size -> its
    groups. What vLLM reports beside the runs goes to the method's settings (`run`); a
    method whose process fails, or vllm_sd_learned without its export folder, is skipped with
    the reason."""
    b, found = cfg.bench, {}
    eos = setup.models.eos_token_id
    for name in [n for n in setup.names if n in vllm_peer.VLLM_NAMES]:
        settings = setup.plan.settings[name]
        if name == vllm_peer.VLLM_SD_LEARNED and not settings.get("predictor"):
            setup.plan.skipped[name] = "no sd_learned export folder (the bench stage writes one)"
            continue
        settings["dtype"] = vllm_peer.vllm_dtype(settings["dtype"], setup.dtype)
        request = vllm_peer.build_request(
            settings,
            setup.prompts,
            sampling=setup.engine.sampling,
            max_new_tokens=int(b.max_new_tokens),
            seed=int(b.seed),
            batch_sizes=setup.batch_sizes,
            stop_token_ids=[] if eos is None else [eos],
            dtype=settings["dtype"],
        )
        log.info("bench: %s in vLLM, batch sizes %s", name, setup.batch_sizes)
        try:
            result = vllm_peer.run_method(
                settings["python"], request, torch.get_num_threads(), settings["kv_cache_gib"]
            )
        except vllm_peer.PeerUnavailable as error:
            log.error("bench: skipping %s: %s", name, error)
            setup.plan.skipped[name] = str(error)
            continue
        found[name], settings["run"] = vllm_peer.parse_result(
            result, setup.prompts, setup.batch_sizes
        )
    return found


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
    outside = vllm_runs(cfg, setup)  # method -> batch size -> its groups

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
        names = [n for n in setup.names if n not in outside and (size == 1 or n not in plan.peers)]
        here: dict[str, list[GroupRun]] = {}
        if names:
            here = run_methods(
                decode,
                names,
                setup.prompts,
                size,
                int(b.seed),
                int(b.warmup_runs),
                setup.device if b.energy and size == 1 else None,
                int(b.min_timed_runs),
                seconds,
                warm_up,
            )
        # bench.methods' order
        runs[size] = {
            n: outside[n][size] if n in outside else here[n]
            for n in setup.names
            if n in outside or n in here
        }
        if warmups is not None:
            warmups[size] = seconds
        if after_size is not None and size != setup.batch_sizes[-1]:
            after_size(runs)
    return runs
