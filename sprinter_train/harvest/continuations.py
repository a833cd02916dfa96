"""Build the sequence each prompt is teacher-forced on, one per SPRINTER prefix mix.

`original`: the prompt plus the dataset's own continuation (a chat reply, a canonical
solution, the rest of a text). `draft` / `target`: a continuation sampled from that model.
`interleaved`: a continuation produced as speculative decoding produces it, draft tokens the
target accepted with min(1, p/q) and target corrections drawn from norm(max(0, p - q)).
Every prompt samples from its own seeded generator, so a sequence never depends on the batch
or shard it was built in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedTokenizerBase

from sprinter_train.core.rules import speculative_step
from sprinter_train.core.sampling import SamplingConfig, sample, warp_probs
from sprinter_train.data.prompts import Prompt
from sprinter_train.harvest.mixes import prompt_seed
from sprinter_train.models.cache import crop_cache
from sprinter_train.models.forward import HarvestModels, body, head_logits


@dataclass(frozen=True)
class HarvestSequence:
    """A full token sequence and the positions [region_start, region_end) it contributes."""

    prompt: Prompt
    mix: str
    input_ids: list[int]
    region_start: int
    region_end: int


def make_generator(seed: int, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


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


def _truncate(tokens: list[int], n: int, eos_token_id: int | None) -> list[int]:
    """At most n tokens, ending at the first EOS (decoding stops there too)."""
    tokens = tokens[:n]
    if eos_token_id is not None and eos_token_id in tokens:
        tokens = tokens[: tokens.index(eos_token_id) + 1]
    return tokens


@torch.no_grad()
def sample_continuations(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    n: int,
    sampling: SamplingConfig,
    generators: Sequence[torch.Generator],
    vocab_size: int,
    eos_token_id: int | None,
    device: torch.device,
) -> list[list[int]]:
    """n tokens sampled from `model` after each prompt: left-padded batch, KV-cached steps."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, device=device)
        mask[row, width - len(prompt) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    final, _, cache = body(model, ids, mask, positions, cache, use_cache=True)
    logits = head_logits(model, final[:, -1], vocab_size)
    next_position = positions[:, -1:] + 1
    out: list[list[int]] = [[] for _ in prompts]
    for step in range(n):
        probs = warp_probs(logits, sampling)
        tokens = [int(sample(probs[row], generators[row])) for row in range(len(prompts))]
        for row, token in enumerate(tokens):
            out[row].append(token)
        done = [eos_token_id is not None and eos_token_id in row for row in out]
        if step == n - 1 or all(done):
            break
        mask = torch.cat([mask, mask.new_ones((len(prompts), 1))], dim=1)
        step_ids = torch.tensor(tokens, device=device).unsqueeze(1)
        final, _, cache = body(model, step_ids, mask, next_position, cache, use_cache=True)
        logits = head_logits(model, final[:, -1], vocab_size)
        next_position = next_position + 1
    return [_truncate(row, n, eos_token_id) for row in out]


@torch.no_grad()
def speculative_continuation(
    draft: torch.nn.Module,
    target: torch.nn.Module,
    prompt: Sequence[int],
    n: int,
    gamma: int,
    sampling: SamplingConfig,
    generator: torch.Generator,
    vocab_size: int,
    eos_token_id: int | None,
    device: torch.device,
) -> list[int]:
    """n tokens as speculative decoding with block size gamma emits them (batch of one)."""
    committed = list(prompt)
    start = len(committed)
    draft_cache, target_cache = (
        DynamicCache(config=draft.config),
        DynamicCache(config=target.config),
    )
    draft_len = target_len = 0  # committed tokens held in each cache
    while len(committed) - start < n:
        base = len(committed)
        g = min(gamma, start + n - base)
        # 1. the draft proposes g tokens, first feeding the committed tokens its cache lacks
        feed, proposals, q_rows = committed[draft_len:], [], []
        for _ in range(g):
            final, _, draft_cache = body(
                draft, torch.tensor([feed], device=device), None, None, draft_cache, use_cache=True
            )
            q = warp_probs(head_logits(draft, final[0, -1], vocab_size), sampling)
            proposals.append(int(sample(q, generator)))
            q_rows.append(q)
            feed = proposals[-1:]
        # 2. one target forward scores every proposal (g + 1 distributions)
        feed = committed[target_len:] + proposals
        final, _, target_cache = body(
            target, torch.tensor([feed], device=device), None, None, target_cache, use_cache=True
        )
        p_rows = warp_probs(head_logits(target, final[0, -(g + 1) :], vocab_size), sampling)
        # 3. accept a prefix of the proposals, then a correction or bonus token from the target
        accepted, next_token = speculative_step(p_rows, torch.stack(q_rows), proposals, generator)
        committed += proposals[:accepted] + [next_token]
        # 4. drop rejected proposals from the caches (the draft never fed its last proposal)
        draft_len = base + min(accepted, g - 1)
        target_len = base + accepted
        crop_cache(draft_cache, draft_len)
        crop_cache(target_cache, target_len)
        if eos_token_id is not None and eos_token_id in committed[base:]:
            break
    return _truncate(committed[start:], n, eos_token_id)


def build_sequences(
    models: HarvestModels,
    prompts: Sequence[Prompt],
    mixes: Sequence[str],
    length: int,
    original_length: int,
    gamma: int,
    sampling: SamplingConfig,
    seed: int,
    device: torch.device,
) -> list[HarvestSequence]:
    """The sequence of every prompt of one batch: `length` generated tokens, or the first
    `original_length` reference tokens. Generation is batched per generating model."""
    continuations: dict[int, list[int]] = {}
    for mix, model in (("draft", models.draft.model), ("target", models.target.model)):
        rows = [i for i, m in enumerate(mixes) if m == mix]
        if rows:
            generators = [
                make_generator(prompt_seed(seed, prompts[i].prompt_id, "continuation"), device)
                for i in rows
            ]
            sampled = sample_continuations(
                model,
                [prompts[i].input_ids for i in rows],
                length,
                sampling,
                generators,
                models.vocab_size,
                models.eos_token_id,
                device,
            )
            continuations.update(zip(rows, sampled, strict=True))
    for i, mix in enumerate(mixes):
        if mix == "interleaved":
            generator = make_generator(
                prompt_seed(seed, prompts[i].prompt_id, "continuation"), device
            )
            continuations[i] = speculative_continuation(
                models.draft.model,
                models.target.model,
                prompts[i].input_ids,
                length,
                gamma,
                sampling,
                generator,
                models.vocab_size,
                models.eos_token_id,
                device,
            )
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
