"""Build the sequence each prompt is teacher-forced on, of the prefix mix it was assigned.

`original`: the prompt plus the dataset's own continuation (a chat reply, a canonical
solution, the rest of a text); a prompt without one contributes its own tail. `draft` /
`target`: a continuation sampled from that model.
`interleaved`: what SPRINTER's decoder leaves behind, runs of draft tokens kept as the draft
drew them between single target tokens, the runs geometric with the pair's acceptance
(decoding/interleaved.py). `sd_interleaved` (weight 0 by default): the continuation lossless
speculative decoding with block size gamma produces, which follows the target's law.

The generated mixes come from the batched decoding engine (the same loop the bench
measures); a few target and interleaved rows share one call, whose target forwards serve
both. Each row draws from its own stream keyed by its prompt's seed, so a sequence never
depends on the batch or shard it was built in. Each generated sequence notes which of its
tokens the draft sampled and were kept as drawn (`HarvestSequence.from_draft`). Every call
of one harvest runs on the same `ModelRunner`s (`ContinuationRunners`, which every builder
here takes: the caller makes them once), laid out and packed as the `decoding` section says
(static, compiled, `pack_every`), as the bench's are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.batch import Policy
from sprinter_train.decoding.builder import build_engine, build_runner
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.interleaved import InterleavedRuns
from sprinter_train.decoding.policies import SpeculativeDecoding, TargetOnly
from sprinter_train.decoding.runner.runner import ModelRunner
from sprinter_train.harvest.mixes import prompt_seed
from sprinter_train.models.roles import Roles

GENERATED_MIXES = ("draft", "target", "interleaved", "sd_interleaved")


@dataclass(frozen=True)
class HarvestSequence:
    """A full token sequence and the positions [region_start, region_end) it contributes."""

    prompt: Prompt
    mix: str
    input_ids: list[int]
    region_start: int
    region_end: int
    from_draft: tuple[bool, ...] = ()  # per input_ids token: sampled by the draft and kept as
    # drawn (empty: all False)

    @property
    def draft_flags(self) -> tuple[bool, ...]:
        """`from_draft` at full length (one flag per token of input_ids)."""
        return self.from_draft or (False,) * len(self.input_ids)


@dataclass(frozen=True)
class RunLaw:
    """The `interleaved` mix's runs: after each draft token the run goes on with probability
    `accept` (None: not resolved, no interleaved rows allowed); at most `max_run` drafts a
    round (a longer run goes on in the next round, so the law is unchanged)."""

    accept: float | None
    max_run: int


@dataclass(frozen=True)
class Continuation:
    """A row's generated tokens and, per token, whether the draft sampled it and it was kept."""

    tokens: list[int]
    from_draft: tuple[bool, ...]


@dataclass
class ContinuationRunners:
    """Each model's `ModelRunner` for a whole harvest, built on first use with `layout`
    (`decoding.builder.runner_layout`'s keyword arguments; empty: the runner's default
    layout) and reused by every engine call. A runner holds its compiled graphs and its KV
    buffer pool (`KVPool`): a runner built per batch would recompile every batch and
    reallocate its buffers. `pack_every`: the engines' (`decoding.pack_every`, required:
    speed only)."""

    models: Roles
    layout: dict[str, Any] = field(default_factory=dict)
    pack_every: int = field(kw_only=True)
    _built: dict[str, ModelRunner] = field(default_factory=dict, init=False, repr=False)

    def runner(self, role: str) -> ModelRunner:
        """The runner of `role` (draft or target), built once."""
        if role not in self._built:
            model = getattr(self.models, role).model
            self._built[role] = build_runner(model, self.models.vocab_size, self.layout, role=role)
        return self._built[role]

    def engine(self, sampling: SamplingConfig, role: str, draft: bool = False) -> Engine:
        """An engine whose target is `role`'s runner, with the draft's beside it if `draft`
        (an engine is cheap: its per-call state is fresh, its runners the harvest's)."""
        return build_engine(
            self.runner(role),
            sampling,
            self.models.vocab_size,
            draft=self.runner("draft") if draft else None,
            eos_token_id=self.models.eos_token_id,
            pack_every=self.pack_every,
        )


def original_sequence(
    prompt: Prompt, tokenizer: PreTrainedTokenizerBase, length: int
) -> tuple[list[int], int, int]:
    """Prompt + the first `length` tokens of its reference; without one, the prompt's own tail."""
    reference = prompt.reference or ""
    ref_ids = list(tokenizer(reference, add_special_tokens=False)["input_ids"])[:length]
    ids = list(prompt.input_ids) + ref_ids
    if ref_ids:
        return ids, len(prompt.input_ids), len(ids)
    return ids, max(1, len(ids) - length), len(ids)


def continuation_engine(
    models: Roles,
    mixes: Sequence[str],
    gamma: int,
    runs: RunLaw,
    sampling: SamplingConfig,
    runners: ContinuationRunners,
) -> tuple[Engine, Policy]:
    """The engine and policy that generate rows of these mixes (one per row) in one call:
    target-only decoding of the mix's model, the interleaved runs (with target rows sharing
    the call: they draft nothing), or SD with block size gamma; no hidden states are needed.
    The engine runs on `runners`' runners (`models`' own)."""
    runners = runners_for(models, runners)
    kinds = set(mixes)
    if kinds <= {"target", "interleaved"} and "interleaved" in kinds:
        if runs.accept is None:
            raise ValueError("interleaved rows need harvest.interleaved_accept resolved")
        drafting = None
        if kinds != {"interleaved"}:
            drafting = frozenset(i for i, mix in enumerate(mixes) if mix == "interleaved")
        policy: Policy = InterleavedRuns(runs.accept, runs.max_run, drafting)
        return runners.engine(sampling, "target", draft=True), policy
    if kinds == {"sd_interleaved"}:
        return runners.engine(sampling, "target", draft=True), SpeculativeDecoding(gamma)
    if len(kinds) != 1 or not kinds <= {"draft", "target"}:
        raise ValueError(
            f"mixes {sorted(kinds)} are not generated in one call; one of {GENERATED_MIXES}, "
            "or target and interleaved together"
        )
    return runners.engine(sampling, "draft" if kinds == {"draft"} else "target"), TargetOnly()


def runners_for(models: Roles, runners: ContinuationRunners) -> ContinuationRunners:
    """`runners`, checked to be `models`' own."""
    if runners.models is not models:
        raise ValueError("the continuation runners were built for other models")
    return runners


def generate_continuations(
    models: Roles,
    prompts: Sequence[Prompt],
    mixes: Sequence[str],
    length: int,
    gamma: int,
    runs: RunLaw,
    sampling: SamplingConfig,
    seed: int,
    runners: ContinuationRunners,
) -> list[Continuation]:
    """At most `length` tokens after each prompt (row i of mix mixes[i]), ending at the first
    EOS: one batched `generate` call, row i seeded by its prompt
    (`prompt_seed(seed, id, "continuation")`, 63 bits: a non-negative int64 key of
    `RowStreams`). A `draft` row is all draft tokens, a `target` row none; the engine says
    which of an interleaved row's are (`GenerationResult.from_draft`); `runners`: see
    `continuation_engine`."""
    engine, policy = continuation_engine(models, mixes, gamma, runs, sampling, runners)
    seeds = [prompt_seed(seed, p.prompt_id, "continuation") for p in prompts]
    results = engine.generate([p.input_ids for p in prompts], policy, length, seeds)
    # the engine notes each emitted token a round kept as drawn (accepted or run drafts); a
    # `draft` row's model is the engine's only one, so its tokens are the draft's by the mix
    return [
        Continuation(r.tokens, (True,) * len(r.tokens) if mix == "draft" else tuple(r.from_draft))
        for mix, r in zip(mixes, results, strict=True)
    ]


def generation_calls(mixes: Sequence[str], shared_rows: int) -> list[list[int]]:
    """The rows (indices into `mixes`) of each engine call: one call per generated mix, but
    the target and interleaved rows together when there are both and at most `shared_rows`
    of them (0: never)."""
    rows = {mix: [i for i, m in enumerate(mixes) if m == mix] for mix in GENERATED_MIXES}
    together = sorted(rows["target"] + rows["interleaved"])
    if rows["target"] and rows["interleaved"] and len(together) <= shared_rows:
        return [r for r in (rows["draft"], together, rows["sd_interleaved"]) if r]
    return [r for r in rows.values() if r]


def build_sequences(
    models: Roles,
    prompts: Sequence[Prompt],
    mixes: Sequence[str],
    length: int,
    original_length: int,
    gamma: int,
    runs: RunLaw,
    sampling: SamplingConfig,
    seed: int,
    shared_rows: int = 8,
    *,
    runners: ContinuationRunners,
) -> list[HarvestSequence]:
    """The sequence of every prompt of one batch: `length` generated tokens, or the first
    `original_length` reference tokens. Each generated mix's rows are one engine call, or
    the target and interleaved rows share one (`generation_calls`), all on `runners`' runners
    (`models`' own, shared by its calls). `from_draft` covers the whole
    sequence where the draft made any of a row's tokens (draft and interleaved mixes), else
    it is empty (all False)."""
    runners = runners_for(models, runners)
    continuations: dict[int, Continuation] = {}
    for rows in generation_calls(mixes, shared_rows):
        generated = generate_continuations(
            models,
            [prompts[i] for i in rows],
            [mixes[i] for i in rows],
            length,
            gamma,
            runs,
            sampling,
            seed,
            runners,
        )
        continuations.update(zip(rows, generated, strict=True))
    sequences = []
    for i, (prompt, mix) in enumerate(zip(prompts, mixes, strict=True)):
        from_draft: tuple[bool, ...] = ()
        if mix == "original":
            ids, region_start, region_end = original_sequence(
                prompt, models.tokenizer, original_length
            )
        else:
            made = continuations[i]
            ids = list(prompt.input_ids) + made.tokens
            region_start, region_end = len(prompt.input_ids), len(ids)
            if mix != "target":
                from_draft = (False,) * len(prompt.input_ids) + made.from_draft
        sequences.append(
            HarvestSequence(prompt, mix, ids, region_start, region_end, from_draft=from_draft)
        )
    return sequences
