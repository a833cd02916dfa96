"""Where sd_learned's predictor enters vLLM's speculative decoding (vLLM 0.32.0, the
`draft_model` method): three methods wrapped, none rewritten.

- `GPUModelRunner.propose_draft_token_ids` (the CPU runner inherits it): before each
  propose, the step's verified rounds (drafts scheduled, tokens the rejection sampler kept)
  update each request's row state, and the batch's request ids and sampling go to the drafter;
- `SpecDecodeBaseProposer.propose` (a `DraftModelProposer`'s): a round the predictor would
  not draft runs with 0 speculative tokens (vLLM still feeds the draft the verified tokens,
  keeping its KV cache); otherwise the round is drafted as vLLM drafts it and each request's
  drafts are cut where sd_learned's rule stopped it, a list a request (the scheduler takes any
  length; the rejection sampler reads each request's first drafts' probabilities);
- `SpecDecodeBaseProposer._sample_draft_tokens`: after each draft step, the predictor scores
  the drawn tokens (the step's hidden states, the head's logits) and, when no request drafts
  on, the loop ends there (`_AllStopped`), so a round costs the draft steps it uses.

The law stays the target's: whether a request draws its (j+1)-th draft depends only on its
j drafts already drawn (a stopping time), and vLLM's rejection sampler checks every proposed
draft against the draft probabilities it was drawn from (`draft_sample_method=
"probabilistic"`; greedy drafts are the draft's argmax).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from sprinter_train.serving.vllm.predictor import LengthPredictor, Round, sampling_of

PREDICTOR: LengthPredictor | None = None  # the installed one (a test reads its trace)


class _AllStopped(Exception):
    """Every request of the round stopped drafting: leave vLLM's draft loop."""


def install(folder: str) -> LengthPredictor:
    """Load the predictor of the export `folder` and wrap vLLM's methods (once a process)."""
    global PREDICTOR
    if PREDICTOR is not None and str(PREDICTOR.folder) == str(folder):
        return PREDICTOR
    PREDICTOR = LengthPredictor(folder)
    _wrap()
    return PREDICTOR


@functools.cache
def _wrap() -> None:
    from vllm.v1.spec_decode.draft_model import DraftModelProposer
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner_propose = GPUModelRunner.propose_draft_token_ids
    base_propose = SpecDecodeBaseProposer.propose
    base_sample = SpecDecodeBaseProposer._sample_draft_tokens
    signature = inspect.signature(runner_propose)

    @functools.wraps(runner_propose)
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata,
                                *args: Any, **kwargs: Any):  # fmt: skip
        drafter = getattr(self, "drafter", None)
        if PREDICTOR is not None and isinstance(drafter, DraftModelProposer):
            named = signature.bind(
                self, scheduler_output, sampled_token_ids, sampling_metadata, *args, **kwargs
            ).arguments
            spec = named.get("spec_decode_metadata")
            req_ids = list(self.input_batch.req_ids)
            counts = _observe(req_ids, sampled_token_ids, spec)
            contexts = None
            if PREDICTOR.trace is not None:  # each request's tokens before its drafts
                states = [self.requests[r] for r in req_ids]
                contexts = [
                    len(s.prompt_token_ids or ()) + len(s.output_token_ids) + c
                    for s, c in zip(states, counts, strict=True)
                ]
            drafter._sprinter_batch = (req_ids, sampling_metadata, contexts)
        return runner_propose(
            self, scheduler_output, sampled_token_ids, sampling_metadata, *args, **kwargs
        )

    @functools.wraps(base_propose)
    def propose(self, num_speculative_tokens, *args: Any, **kwargs: Any):
        batch = getattr(self, "_sprinter_batch", None)
        if PREDICTOR is None or batch is None or not isinstance(self, DraftModelProposer):
            return base_propose(self, num_speculative_tokens, *args, **kwargs)
        self._sprinter_batch = None
        req_ids, sampling, contexts = batch
        if not PREDICTOR.bound:
            _bind(self.model)
        rnd = None
        if num_speculative_tokens > 0:
            configs = sampling_of(
                None if sampling.all_greedy else sampling.temperature,
                sampling.top_p,
                sampling.top_k,
                len(req_ids),
            )
            rnd = PREDICTOR.start(req_ids, configs, self.device)
            if rnd is not None:
                rnd.contexts = contexts
        if rnd is None:  # not worth a draft: the draft still reads the verified tokens
            base_propose(self, 0, *args, **kwargs)
            return [[] for _ in req_ids]
        self._sprinter_round = rnd
        try:
            base_propose(self, num_speculative_tokens, *args, **kwargs)
        except _AllStopped:
            pass
        finally:
            self._sprinter_round = None
        self._last_draft_probs = torch.stack(rnd.probs, 1).contiguous() if rnd.probs else None
        if PREDICTOR.trace is not None:
            PREDICTOR.trace.append(rnd.record())
        return rnd.drafts()

    @functools.wraps(base_sample)
    def _sample_draft_tokens(self, hidden_states, sampling_metadata):
        tokens, probs = base_sample(self, hidden_states, sampling_metadata)
        rnd: Round | None = getattr(self, "_sprinter_round", None)
        if rnd is not None:
            head = getattr(self.model, "head_logits", None)
            if head is None or head.shape[0] != hidden_states.shape[0]:
                self.model.compute_logits(hidden_states)
                head = self.model.head_logits
            if not rnd.step(tokens, probs, hidden_states, head):
                raise _AllStopped
        return tokens, probs

    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids
    SpecDecodeBaseProposer.propose = propose
    SpecDecodeBaseProposer._sample_draft_tokens = _sample_draft_tokens


def _observe(req_ids: list[str], sampled: Any, spec: Any) -> list[int]:
    """The step's verified rounds into the predictor's row state: drafts scheduled per
    request (`spec.num_draft_tokens`; none on a step without drafts) and tokens kept (the
    sampled tokens, -1 where rejected, less the target's own). Returns each request's
    tokens sampled this step."""
    assert PREDICTOR is not None
    rows = len(req_ids)
    drafted = [0] * rows if spec is None else [int(n) for n in spec.num_draft_tokens]
    if torch.is_tensor(sampled):
        counts = (sampled[:rows] != -1).sum(1).tolist()
    else:
        counts = [len(tokens) for tokens in sampled[:rows]]
    kept = [max(0, min(int(c) - 1, d)) for c, d in zip(counts, drafted, strict=True)]
    PREDICTOR.rows.observe(req_ids, drafted, kept)
    return [int(c) for c in counts]


def _bind(model: torch.nn.Module) -> None:
    """The predictor reads the draft's embedding (its token table) and head token ids."""
    assert PREDICTOR is not None
    head_ids = getattr(model, "head_token_ids", None)
    support = head_ids() if head_ids is not None else None
    vocab = int(getattr(model, "vocab_size", 0) or model.config.vocab_size)
    PREDICTOR.bind(model.model.embed_tokens, support, vocab)
