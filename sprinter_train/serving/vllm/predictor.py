"""sd_learned's predictor as vLLM's draft loop asks it: score each drafted token, stop each
request where sd_learned stops.

Read from an `stage=export export.method=sd_learned` folder (hf/bundle.py, the reader the
Hugging Face export uses): the verifier (its checkpoint and sidecar), the latency profile the
goodput rule prices rounds with, and the method's settings. The decisions are the project's
own code: the policy object is `LearnedLength` (its prior, its costs, whether a round is worth
a draft), the score is the verifier's `FusedLinearScore` over the features of
decoding/features (the draft's hidden state and logits of the step, the drafted token, the
request's row state), the stop is `RoundStops` (plans/stop_rules.py), which the decoder's
sd_learned runs. Nothing here imports vLLM: the proposer hands in tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sprinter_train.core.sampling import SamplingConfig, warp_probs
from sprinter_train.decoding.batch import DraftStep, RowState
from sprinter_train.decoding.policies.learned import LearnedLength, scores_before_the_draw
from sprinter_train.decoding.policies.plans.stop_rules import RoundStops
from sprinter_train.decoding.timings import Timings
from sprinter_train.hf.bundle import Bundle
from sprinter_train.verifier.fused import FusedLinearScore
from sprinter_train.verifier.scorer import CheckpointVerifier


class _Embeddings:
    """What CheckpointVerifier asks of a draft model: its input embedding module."""

    def __init__(self, embedding: torch.nn.Module) -> None:
        self.embedding = embedding

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.embedding


@dataclass
class Requests:
    """Each request's row state across rounds, by vLLM request id: its drafts kept and
    proposed so far (RowState.accepted / drafted). A lossless round always ends on the
    target's token, so a row's run of draft-made tokens is 0 at every round start."""

    accepted: dict[str, float] = field(default_factory=dict)
    drafted: dict[str, float] = field(default_factory=dict)

    def observe(self, req_ids: list[str], drafted: list[int], kept: list[int]) -> None:
        """The step's verified rounds: request i proposed drafted[i], the target kept kept[i].
        Requests gone from the batch (finished or preempted) are forgotten."""
        live = set(req_ids)
        for book in (self.accepted, self.drafted):
            for gone in [r for r in book if r not in live]:
                del book[gone]
        for req, d, a in zip(req_ids, drafted, kept, strict=True):
            self.drafted[req] = self.drafted.get(req, 0.0) + float(d)
            self.accepted[req] = self.accepted.get(req, 0.0) + float(a)

    def state(self, req_ids: list[str], device: torch.device) -> RowState:
        def column(book: dict[str, float]) -> torch.Tensor:
            values = [book.get(r, 0.0) for r in req_ids]
            return torch.tensor(values, dtype=torch.float32, device=device)

        run = torch.zeros(len(req_ids), dtype=torch.long, device=device)
        return RowState(run, column(self.accepted), column(self.drafted), None, None)  # type: ignore[arg-type]


def sampling_of(temperature: torch.Tensor | None, top_p: Any, top_k: Any, rows: int) -> list:
    """One SamplingConfig a row from vLLM's per-request sampling tensors (None: greedy /
    unset); float32 values read back at float32's precision (0.2, not 0.20000000298)."""
    configs = []
    for i in range(rows):
        t = 0.0 if temperature is None else _single(temperature[i])
        p = 1.0 if top_p is None else _single(top_p[i])
        k = 0 if top_k is None else int(top_k[i])
        configs.append(SamplingConfig(t, k if 0 < k < 1 << 30 else 0, p))
    return configs


def _single(value: Any) -> float:
    return float(f"{float(value):.7g}")


class LengthPredictor:
    """sd_learned's verifier and stop rule, ready to score a vLLM draft model's steps."""

    def __init__(self, folder: str | Path) -> None:
        bundle = Bundle.from_folder(folder)
        if bundle.method != "sd_learned":
            raise ValueError(
                f"{folder} exports {bundle.method}; vLLM's predictor is sd_learned's: "
                "python -m sprinter_train stage=export export.method=sd_learned"
            )
        if bundle.table() is not None:
            raise ValueError(
                f"{folder} carries SV's table, which reads a companion model vLLM does not "
                "run: export sd_learned without models.companion"
            )
        checkpoint, profile = bundle.verifier(), bundle.latency()
        if checkpoint is None or profile is None:
            raise ValueError(f"{folder} lacks the verifier or latency.json sd_learned needs")
        self.folder = Path(folder)
        self.checkpoint = checkpoint
        self.settings = dict(bundle.manifest["settings"])
        self.timings = Timings(**profile.priors(), learn=False)  # as the HF export prices
        self.policy: LearnedLength | None = None
        self.scorer: FusedLinearScore | None = None
        self.rows = Requests()
        self.trace: list[dict[str, Any]] | None = None  # rounds, when a test asks for them

    def bind(self, embedding: torch.nn.Module, support: torch.Tensor | None, vocab: int) -> None:
        """The draft's input embedding (the score's token table) and head token ids."""
        verifier = CheckpointVerifier(self.checkpoint, _Embeddings(embedding))
        if verifier.fused is None or scores_before_the_draw(verifier):
            raise ValueError(
                f"{self.checkpoint.path}: vLLM's predictor scores a linear verifier of the "
                "drafted token's features; this one is an MLP or reads only pre-draw features"
            )
        self.policy = LearnedLength(
            verifier=verifier,
            table=None,
            max_gamma=int(self.settings.get("max_gamma", 8)),
            stop_rule=self.settings.get("stop_rule"),
        )
        self.scorer = verifier.fused
        self.scorer.bind(support, vocab)
        self.support = support
        self.head_index: torch.Tensor | None = None
        if support is not None:
            index = torch.full((vocab,), -1, dtype=torch.long, device=support.device)
            index[support] = torch.arange(len(support), device=support.device)
            self.head_index = index

    @property
    def bound(self) -> bool:
        return self.policy is not None

    def start(self, req_ids: list[str], sampling: list[SamplingConfig], device) -> Round | None:
        """A round for these requests, or None where sd_learned would not draft this round
        (its rule at this batch size is `none`, or no draft at its prior pays)."""
        assert self.policy is not None, "bind() first"
        stops = self.policy.round_stops(self.timings, len(req_ids))
        if stops is None:
            return None
        return Round(self, req_ids, sampling, self.rows.state(req_ids, device), stops)

    @torch.inference_mode()
    def score(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        head_logits: torch.Tensor,
        index: int,
        state: RowState,
        sampling: list[SamplingConfig],
    ) -> torch.Tensor:
        """(rows,) the verifier's calibrated score of each row's drafted token (vocabulary
        ids), the `index`-th draft of its round, from the step's hidden state (rows, d) and
        head logits (rows, K), its q warped as the project warps (core/sampling.py)."""
        assert self.scorer is not None
        head_logits = head_logits.float()
        if all(s == sampling[0] for s in sampling):
            head_q = warp_probs(head_logits, sampling[0])
        else:
            head_q = torch.cat(
                [warp_probs(head_logits[i : i + 1], s) for i, s in enumerate(sampling)]
            )
        head_tokens = tokens if self.head_index is None else self.head_index[tokens]
        step = DraftStep(
            tokens,
            head_q,
            hidden.float(),
            head_logits,
            torch.ones(len(tokens), dtype=torch.bool, device=tokens.device),
            self.support,
            self.scorer.vocab_size,
            head_tokens=head_tokens,
            index=index,
        )
        return self.scorer(step, state).double()


class Round:
    """One vLLM propose call under the predictor: each step's drafts go in, each row's
    length comes out (`lengths`: the drafts before and including the one it stopped at)."""

    def __init__(
        self,
        predictor: LengthPredictor,
        req_ids: list[str],
        sampling: list[SamplingConfig],
        state: RowState,
        stops: RoundStops,
    ) -> None:
        self.predictor, self.req_ids, self.sampling = predictor, req_ids, sampling
        self.state, self.stops = state, stops
        rows = len(req_ids)
        self.active = torch.ones(rows, dtype=torch.bool, device=state.accepted.device)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=state.accepted.device)
        self.tokens: list[torch.Tensor] = []
        self.probs: list[torch.Tensor] = []
        self.scores: list[torch.Tensor] = []
        self.contexts: list[int] | None = None  # each request's tokens before its drafts

    def step(
        self,
        tokens: torch.Tensor,
        probs: torch.Tensor | None,
        hidden: torch.Tensor,
        head_logits: torch.Tensor,
    ) -> bool:
        """One draft step's tokens (rows,), vLLM's draft probabilities (or None: greedy),
        the hidden states that gave them and the head's logits; whether any row drafts on."""
        rows = len(self.req_ids)
        tokens, hidden, head_logits = tokens[:rows], hidden[:rows], head_logits[:rows]
        index = len(self.tokens)
        self.tokens.append(tokens)
        if probs is not None:
            self.probs.append(probs)
        self.lengths += self.active
        score = self.predictor.score(tokens, hidden, head_logits, index, self.state, self.sampling)
        self.scores.append(score)
        self.active = self.active & ~self.stops.after(score)
        return bool(self.active.any())

    def drafts(self) -> list[list[int]]:
        """Each request's drafts, cut where its rule stopped it."""
        if not self.tokens:
            return [[] for _ in self.req_ids]
        ids = torch.stack(self.tokens, 1).tolist()
        return [row[:n] for row, n in zip(ids, self.lengths.tolist(), strict=True)]

    def record(self) -> dict[str, Any]:
        """What a test compares with the project's scorer and rule."""
        return {
            "req_ids": list(self.req_ids),
            "tokens": torch.stack(self.tokens, 1).tolist() if self.tokens else [],
            "scores": torch.stack(self.scores, 1).tolist() if self.scores else [],
            "lengths": self.lengths.tolist(),
            "accepted": self.state.accepted.tolist(),
            "drafted": self.state.drafted.tolist(),
            "rows": len(self.req_ids),
            "contexts": self.contexts,
        }
