"""Build the sequence each prompt is teacher-forced on, one per SPRINTER prefix mix.

`original`: the prompt plus the dataset's own continuation (a chat reply, a canonical
solution, the rest of a text). `draft` / `target`: a continuation sampled from that model.
`interleaved`: a continuation produced as speculative decoding produces it, draft tokens the
target accepted with min(1, p/q) and target corrections drawn from norm(max(0, p - q)).

The three generated mixes come from the batched decoding engine (the same loop the bench
measures): target-only decoding of the draft or the target model, and speculative decoding
with block size gamma. Each row draws from its own stream keyed by its prompt's seed, so a
sequence never depends on the batch or shard it was built in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import SpeculativeDecoding, TargetOnly
from sprinter_train.decoding.runner import ModelRunner
from sprinter_train.decoding.state import Policy
from sprinter_train.harvest.mixes import prompt_seed
from sprinter_train.models.forward import HarvestModels

GENERATED_MIXES = ("draft", "target", "interleaved")


@dataclass(frozen=True)
class HarvestSequence:
    """A full token sequence and the positions [region_start, region_end) it contributes."""

    prompt: Prompt
    mix: str
    input_ids: list[int]
    region_start: int
    region_end: int


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
    models: HarvestModels, mix: str, gamma: int, sampling: SamplingConfig
) -> tuple[Engine, Policy]:
    """The engine and policy that generate one mix's continuations: target-only decoding of
    the mix's model, or draft + target speculative decoding (no hidden states are needed)."""
    vocab, eos = models.vocab_size, models.eos_token_id
    if mix == "interleaved":
        engine = Engine(
            ModelRunner(models.target.model, vocab),
            sampling,
            draft=ModelRunner(models.draft.model, vocab),
            eos_token_id=eos,
        )
        return engine, SpeculativeDecoding(gamma)
    if mix not in ("draft", "target"):
        raise ValueError(f"mix {mix!r} is not generated; generated mixes: {GENERATED_MIXES}")
    model = models.draft.model if mix == "draft" else models.target.model
    return Engine(ModelRunner(model, vocab), sampling, eos_token_id=eos), TargetOnly()


def generate_continuations(
    models: HarvestModels,
    prompts: Sequence[Prompt],
    mix: str,
    length: int,
    gamma: int,
    sampling: SamplingConfig,
    seed: int,
) -> list[list[int]]:
    """At most `length` tokens after each prompt, ending at the first EOS: one batched
    `generate` call, row i seeded by its prompt (`prompt_seed(seed, id, "continuation")`,
    63 bits: a non-negative int64 key of `RowStreams`)."""
    engine, policy = continuation_engine(models, mix, gamma, sampling)
    seeds = [prompt_seed(seed, p.prompt_id, "continuation") for p in prompts]
    results = engine.generate([p.input_ids for p in prompts], policy, length, seeds)
    return [result.tokens for result in results]


def build_sequences(
    models: HarvestModels,
    prompts: Sequence[Prompt],
    mixes: Sequence[str],
    length: int,
    original_length: int,
    gamma: int,
    sampling: SamplingConfig,
    seed: int,
) -> list[HarvestSequence]:
    """The sequence of every prompt of one batch: `length` generated tokens, or the first
    `original_length` reference tokens. Each generated mix's rows are one engine call."""
    continuations: dict[int, list[int]] = {}
    for mix in GENERATED_MIXES:
        rows = [i for i, m in enumerate(mixes) if m == mix]
        if rows:
            generated = generate_continuations(
                models, [prompts[i] for i in rows], mix, length, gamma, sampling, seed
            )
            continuations.update(zip(rows, generated, strict=True))
    sequences = []
    for i, (prompt, mix) in enumerate(zip(prompts, mixes, strict=True)):
        if mix == "original":
            ids, region_start, region_end = original_sequence(
                prompt, models.tokenizer, original_length
            )
        else:
            ids = list(prompt.input_ids) + continuations[i]
            region_start, region_end = len(prompt.input_ids), len(ids)
        sequences.append(HarvestSequence(prompt, mix, ids, region_start, region_end))
    return sequences
