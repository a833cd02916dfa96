"""HF assisted generation as the benchmark peer, on tiny random models."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from transformers import PreTrainedModel

from sprinter_train.bench.peers.hf_assisted import PeerRun, run_hf_assisted, sampling_kwargs
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.models.student import SprinterDraftForCausalLM
from sprinter_train.models.tiny import build_tiny_model, build_tiny_tokenizer

CPU = torch.device("cpu")
GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(scope="module")
def target() -> PreTrainedModel:
    return build_tiny_model({}, seed=0)


@pytest.fixture(scope="module")
def drafts() -> dict[str, PreTrainedModel]:
    restricted = build_tiny_model(
        {"num_hidden_layers": 1, "embed_rank": 16, "head_vocab_size": 64}, seed=1
    )
    assert isinstance(restricted, SprinterDraftForCausalLM)
    return {"full": build_tiny_model({"num_hidden_layers": 1}, seed=1), "restricted": restricted}


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return build_tiny_tokenizer()("The quick brown fox")["input_ids"]


def _plain_greedy(target: PreTrainedModel, prompt: list[int], n: int, eos: int | None) -> list[int]:
    ids = torch.tensor([prompt])
    out = target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=2,
    )
    return out[0, len(prompt) :].tolist()


def _run(target, draft, prompt, **overrides) -> PeerRun:
    settings = {
        "sampling": GREEDY,
        "max_new_tokens": 20,
        "schedule": "constant",
        "num_assistant_tokens": 3,
        "seed": 0,
        "eos_token_id": None,
        "device": CPU,
    }
    return run_hf_assisted(target, draft, prompt, **{**settings, **overrides})


def _full_acceptance_calls(n: int, k: int, schedule: str) -> tuple[int, int]:
    """(target, draft) calls when every drafted token is accepted and nothing stops early.

    Mirrors HF: a round drafts min(k, n - generated - 1) tokens (one forward each), the target
    verifies them in one call and adds a bonus token; "heuristic" then grows k by 2.
    """
    generated = target_calls = draft_calls = 0
    while generated < n:
        drafted = min(k, n - generated - 1)
        draft_calls += drafted
        target_calls += 1
        generated += drafted + 1
        if schedule == "heuristic":
            k += 2
    return target_calls, draft_calls


@pytest.mark.parametrize("schedule", ["constant", "heuristic"])
@pytest.mark.parametrize("draft_name", ["full", "restricted"])
def test_greedy_matches_plain_greedy(target, drafts, prompt, schedule, draft_name) -> None:
    reference = _plain_greedy(target, prompt, 24, None)
    run = _run(target, drafts[draft_name], prompt, max_new_tokens=24, schedule=schedule)
    assert run.tokens == reference
    assert run.wall_s > 0
    # a random draft is mostly rejected: at least one target call per accepted run of tokens
    assert 1 <= run.target_calls <= len(reference)
    assert run.draft_calls >= 1


def test_stops_after_first_eos(target, drafts, prompt) -> None:
    free = _plain_greedy(target, prompt, 20, None)
    eos = free[5]
    first = free.index(eos)
    run = _run(target, drafts["full"], prompt, eos_token_id=eos)
    assert run.tokens == free[: first + 1]


@pytest.mark.parametrize("schedule", ["constant", "heuristic"])
def test_identical_draft_call_counts_are_exact(target, prompt, schedule) -> None:
    # exact counts also prove the confidence-threshold early exit is off (it would cut rounds)
    twin = copy.deepcopy(target)
    run = _run(target, twin, prompt, max_new_tokens=30, schedule=schedule, num_assistant_tokens=2)
    assert run.tokens == _plain_greedy(target, prompt, 30, None)
    assert (run.target_calls, run.draft_calls) == _full_acceptance_calls(30, 2, schedule)


def test_heuristic_schedule_does_not_persist_on_draft(target, prompt) -> None:
    twin = copy.deepcopy(target)
    before = twin.generation_config.to_dict()
    _run(target, twin, prompt, schedule="heuristic")
    assert twin.generation_config.to_dict() == before
    again = _run(target, twin, prompt, schedule="heuristic")
    assert (again.target_calls, again.draft_calls) == _full_acceptance_calls(20, 3, "heuristic")


def test_sampling_with_identical_draft_is_accepted(target, prompt) -> None:
    twin = copy.deepcopy(target)
    sampling = SamplingConfig(temperature=0.8, top_k=0, top_p=1.0)
    run = _run(target, twin, prompt, sampling=sampling, max_new_tokens=25)
    assert len(run.tokens) == 25
    assert run.target_calls < len(run.tokens) + 1
    assert run.target_calls == _full_acceptance_calls(25, 3, "constant")[0]


def test_sampling_kwargs_match_warp_probs() -> None:
    assert sampling_kwargs(GREEDY) == {"do_sample": False}
    # top_k=0 must reach HF as 0: left unset, HF's default top-k of 50 would apply
    assert sampling_kwargs(SamplingConfig(temperature=0.7, top_k=0, top_p=0.9)) == {
        "do_sample": True,
        "temperature": 0.7,
        "top_k": 0,
        "top_p": 0.9,
    }


@pytest.mark.parametrize("draft_name", ["full", "restricted"])
def test_sampling_runs_and_is_seeded(target, drafts, prompt, draft_name) -> None:
    # the restricted head's -inf logits go through every warper without NaN or a crash
    draft = drafts[draft_name]
    for temperature, top_k, top_p in itertools.product([0.5, 1.5], [0, 5], [1.0, 0.8]):
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
        run = _run(target, draft, prompt, sampling=sampling, max_new_tokens=12)
        assert len(run.tokens) == 12
        assert all(0 <= token < target.config.vocab_size for token in run.tokens)
    sampling = SamplingConfig(temperature=1.0)
    first = _run(target, draft, prompt, sampling=sampling, seed=7).tokens
    assert _run(target, draft, prompt, sampling=sampling, seed=7).tokens == first
    others = {tuple(_run(target, draft, prompt, sampling=sampling, seed=s).tokens) for s in (8, 9)}
    assert others != {tuple(first)}


def test_hooks_removed_and_config_restored(target, drafts, prompt) -> None:
    draft = drafts["restricted"]
    own_config = draft.generation_config
    hooks = (len(target._forward_hooks), len(draft._forward_hooks))
    _run(target, draft, prompt)
    assert (len(target._forward_hooks), len(draft._forward_hooks)) == hooks
    assert draft.generation_config is own_config
    with pytest.raises(ValueError, match="schedule"):
        _run(target, draft, prompt, schedule="dynamic")
    assert (len(target._forward_hooks), len(draft._forward_hooks)) == hooks


def test_cleans_up_when_generate_fails(target, drafts, prompt) -> None:
    draft = drafts["full"]
    own_config = draft.generation_config
    with pytest.raises(ValueError, match="max_new_tokens"):  # raised inside HF's generate
        _run(target, draft, prompt, max_new_tokens=-1)
    assert len(target._forward_hooks) == 0 and len(draft._forward_hooks) == 0
    assert draft.generation_config is own_config


def test_rejects_the_target_as_its_own_draft(target, prompt) -> None:
    with pytest.raises(ValueError, match="copy"):
        _run(target, target, prompt)
