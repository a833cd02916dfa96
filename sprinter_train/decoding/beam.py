"""MTAD's beam sampling with the draft: gamma tokens of high joint draft likelihood.

The draft's cache for the committed tokens is copied once per round and widened to the beam;
the sequence's own draft cache is left alone (the accepted tokens are fed to it next round).
Beam sampling perturbs each candidate's joint log-probability with Gumbel noise before the
top-`width` selection (sampling without replacement from the joint, Kool et al. 2019); in
greedy mode there is no noise, and it is beam search.
"""

from __future__ import annotations

import copy

import torch

from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.state import SequenceState


def _gumbel(shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    u = torch.rand(shape, generator=generator, dtype=torch.float64).clamp_(1e-12, 1 - 1e-12)
    return -torch.log(-torch.log(u))


@torch.inference_mode()
def beam_draft(
    engine: Engine, state: SequenceState, gamma: int, width: int
) -> tuple[list[int], list[float]]:
    """(tokens x_1..x_gamma of the best beam, q(x_1:j | input) for j = 1..gamma)."""
    runner = engine.require(engine.draft, "draft")
    first = engine.call_model(runner, state, "draft", [], 1)
    cache = copy.deepcopy(state.slot("draft").cache)
    log_q = engine.warp(first.logits).double().log()  # (1, V)
    scores = torch.zeros(1, dtype=torch.float64)
    history = torch.zeros((1, 0), dtype=torch.long)
    joint = torch.zeros((1, 0), dtype=torch.float64)
    for j in range(gamma):
        candidates = scores[:, None] + log_q  # (beams, V)
        keyed = (
            candidates
            if engine.sampling.greedy
            else candidates + _gumbel(candidates.shape, state.generator)
        )
        k = min(width, int(torch.isfinite(candidates).sum()))
        top = keyed.flatten().topk(max(k, 1)).indices
        beam, token = top // log_q.shape[-1], top % log_q.shape[-1]
        scores = candidates[beam, token]
        history = torch.cat([history[beam], token[:, None]], dim=1)
        joint = torch.cat([joint[beam], scores[:, None]], dim=1)
        if j == gamma - 1:
            break
        if j == 0:
            cache.batch_repeat_interleave(len(beam))
        else:
            cache.batch_select_indices(beam)
        seconds = runner.seconds
        logits, cache = runner.step_rows(cache, token)
        state.stats.draft_calls += 1
        state.stats.draft_seconds += runner.seconds - seconds
        log_q = engine.warp(logits).double().log()
    best = int(scores.argmax())
    return history[best].tolist(), joint[best].exp().tolist()
