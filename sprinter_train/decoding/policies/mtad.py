"""MTAD: beam-sampled drafts kept by a joint-ratio threshold (lossy by design)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from sprinter_train.core.rules import mtad_accept_lengths
from sprinter_train.decoding.batch import Batch, DraftStep, Emitted, Round
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies.base import Method, Traits, verify


@dataclass
class MTAD(Method):
    """MTAD Alg. 1 per row: beam-sample up to gamma drafts, keep the longest prefix whose
    joint ratio min(1, p(x_1:j)/q(x_1:j)) > tau, then one token from the target after it.

    The draft's cache is widened to rows x beam_width for the round and narrowed back to each
    row's best beam (index selections, as beam search reorders caches; nothing is deep-copied).
    Beam sampling perturbs each candidate's joint log-probability with Gumbel noise from the
    row's own stream before the top-`beam_width` selection (sampling without replacement from
    the joint, Kool et al. 2019); in greedy mode there is no noise, and it is beam search. A
    row whose budget allows fewer drafts freezes its beams once it has them.
    """

    # every trait spelt out (Traits has no defaults): the blocks look alike on purpose
    traits: ClassVar[Traits] = Traits(
        lossless=False,
        greedy_exact=True,
        needs=frozenset(),
        law_computed=False,
        exports=False,
        rivals=("sd",),
        record_score=None,
    )

    gamma: int
    beam_width: int
    tau: float
    name: str = "mtad"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        limits = batch.room(self.gamma)
        if max(limits, default=0) == 0:
            return verify(engine, batch, Round())
        B, device = len(batch), engine.device
        limit = engine.tensor(limits)
        drafts, q_joint = self._beams(engine, batch, limit, max(limits))
        rnd = Round(counts=limit)
        rnd.steps = [
            DraftStep(drafts[:, j], None, None, None, j < limit) for j in range(drafts.shape[1])
        ]
        everyone = torch.ones(B, dtype=torch.bool, device=device)
        p = engine.target_probs(batch, rnd, everyone)
        p_x = p[:, :-1].gather(2, drafts[..., None])[..., 0]
        accepted = mtad_accept_lengths(p_x, q_joint, limit, self.tau)
        at = accepted[:, None, None].expand(-1, 1, p.shape[-1])
        token = engine.sample(p.gather(1, at)[:, 0], batch, everyone)
        tokens = torch.cat([drafts, drafts[:, :1]], 1).scatter(1, accepted[:, None], token[:, None])
        return Emitted(tokens, accepted + 1, accepted, limit, accepted)

    def _beams(
        self, engine: Engine, batch: Batch, limit: torch.Tensor, steps: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, steps) tokens of each row's best beam and (B, steps) its joint q of each prefix."""
        B, W, device = len(batch), self.beam_width, engine.device
        cache = batch.caches["draft"]
        first = engine.feed(batch, "draft", limit > 0)
        log_q = engine.warp(first.logits[:, 0]).double().log()[:, None, :]  # (B, 1, V)
        V = log_q.shape[-1]
        scores = torch.zeros((B, 1), dtype=torch.float64, device=device)
        history = torch.zeros((B, 1, 0), dtype=torch.long, device=device)
        joint = torch.zeros((B, 1, 0), dtype=torch.float64, device=device)
        rows = torch.arange(B, device=device)
        identity = torch.arange(W, device=device).expand(B, -1)
        parent = identity
        for j in range(steps):
            live = j < limit
            candidates = (scores[..., None] + log_q).reshape(B, -1)  # (B, beams x V)
            keyed = candidates
            if not engine.sampling.greedy:
                u = batch.streams.grid(candidates.shape[1], live.long()).clamp(1e-12, 1 - 1e-12)
                keyed = candidates - torch.log(-torch.log(u))
            top = keyed.topk(W, dim=1).indices
            parent = torch.where(live[:, None], top // V, identity.clamp(max=scores.shape[1] - 1))
            token = torch.where(live[:, None], top % V, 0)
            picked = candidates.gather(1, top)
            scores = torch.where(live[:, None], picked, scores.gather(1, parent))
            spread = parent[..., None].expand(-1, -1, j)
            history = torch.cat([history.gather(1, spread), token[..., None]], 2)
            joint = torch.cat([joint.gather(1, spread), scores[..., None]], 2)
            if j == steps - 1:
                break
            if j == 0:
                cache.select(rows.repeat_interleave(W))
            else:
                cache.select((rows[:, None] * W + parent).flatten())
            keep = torch.zeros((B * W, 1), dtype=torch.long, device=device)
            counts = live.repeat_interleave(W).long()
            out = engine.forward(batch, "draft", token.reshape(-1, 1), counts, keep)
            log_q = engine.warp(out.logits[:, 0]).double().log().reshape(B, W, V)
        best = scores.argmax(1)
        if steps > 1:
            cache.select(rows * W + parent[rows, best])
        return history[rows, best], joint[rows, best].exp()
