"""Every method on every group of prompts at every batch size, side by side."""

from __future__ import annotations

from omegaconf import DictConfig

from sprinter_train.bench.methods import at_batch_size
from sprinter_train.bench.peer import run_hf_assisted
from sprinter_train.bench.prepare import Setup
from sprinter_train.bench.runs import Decoded, GroupRun, engine_decode, run_methods
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.state import DecodeStats


def decode_all(cfg: DictConfig, setup: Setup) -> dict[int, dict[str, list[GroupRun]]]:
    """Every method on every group of prompts at every batch size, side by side (HF's peers
    at batch 1 only: they decode one sequence)."""
    b, plan, models = cfg.bench, setup.plan, setup.models

    def decode_peer(name: str, group: list[Prompt], seeds: list[int]) -> Decoded:
        (prompt,), (seed,) = group, seeds
        peer = run_hf_assisted(
            models.target.model,
            models.draft.model,
            prompt.input_ids,
            sampling=setup.engine.sampling,
            max_new_tokens=int(b.max_new_tokens),
            seed=seed,
            eos_token_id=models.eos_token_id,
            device=setup.device,
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

        runs[size] = run_methods(
            decode,
            [n for n in setup.names if size == 1 or n not in plan.peers],
            setup.prompts,
            size,
            int(b.seed),
            int(b.warmup_runs),
            setup.device if b.energy and size == 1 else None,
            int(b.min_timed_runs),
        )
    return runs
