"""hf_static, the target alone through HF's static cache (+ compile), on tiny random models:
its greedy rows are target_only's, its sampled rows reproducible, compiled or not."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import PreTrainedModel

from sprinter_train.bench.peers.hf_static import StaticPeer
from sprinter_train.core.config import compose_config
from sprinter_train.core.runtime import resolve_compile
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.decoding.builder import build_engine, build_runner, decoding_problems
from sprinter_train.decoding.policies import TargetOnly
from sprinter_train.models.tiny import build_tiny_model
from sprinter_train.stages.settings import config_problems
from tests.decoding_helpers import PACK_EVERY

CPU = torch.device("cpu")
VOCAB = 128
PROMPTS = [[5, 17, 9, 33], [40, 41, 42, 43, 44, 45, 46], [7, 8]]
GREEDY = SamplingConfig(temperature=0.0)
SAMPLED = SamplingConfig(temperature=0.9, top_k=0, top_p=0.95)
NEW = 24


@pytest.fixture(scope="module")
def target() -> PreTrainedModel:
    return build_tiny_model({}, seed=0)


@pytest.fixture(scope="module")
def reference(target) -> list[list[int]]:
    """target_only's greedy rows in float32, one prompt at a time."""
    engine = build_engine(build_runner(target, VOCAB), GREEDY, VOCAB, pack_every=PACK_EVERY)
    return [engine.generate([p], TargetOnly(), NEW)[0].tokens for p in PROMPTS]


def peer(target, compile: bool, device: torch.device = CPU) -> StaticPeer:
    longest = max(len(p) for p in PROMPTS)
    return StaticPeer(
        target, max_cache_len=longest + NEW, compile=compile, compile_mode="default", device=device
    )


def rows(static: StaticPeer, sampling: SamplingConfig, seed: int = 0, eos=None) -> list[list[int]]:
    return [
        static.run(p, sampling=sampling, max_new_tokens=NEW, seed=seed, eos_token_id=eos).tokens
        for p in PROMPTS
    ]


def test_greedy_rows_equal_target_only_and_one_cache_serves_every_prompt(target, reference) -> None:
    static = peer(target, compile=False)
    assert rows(static, GREEDY) == reference
    assert rows(static, GREEDY) == reference  # the reset cache holds nothing of the last call
    run = static.run(PROMPTS[0], sampling=GREEDY, max_new_tokens=NEW, seed=0, eos_token_id=None)
    assert run.target_calls == NEW and run.draft_calls == 0 and run.wall_s > 0
    assert static.settings() == {"compile": False, "compile_mode": None, "max_cache_len": 31}


def test_stops_after_the_first_eos(target, reference) -> None:
    eos = reference[0][5]
    first = reference[0].index(eos)
    run = peer(target, compile=False).run(
        PROMPTS[0], sampling=GREEDY, max_new_tokens=NEW, seed=0, eos_token_id=eos
    )
    assert run.tokens == reference[0][: first + 1] and run.target_calls == first + 1


def test_sampled_rows_are_reproducible_by_seed(target) -> None:
    static = peer(target, compile=False)
    first = rows(static, SAMPLED, seed=7)
    assert rows(static, SAMPLED, seed=7) == first
    assert rows(static, SAMPLED, seed=8) != first
    assert all(len(r) == NEW for r in first)


def test_a_prompt_longer_than_the_cache_is_refused(target) -> None:
    with pytest.raises(ValueError, match="exceeds the static cache"):
        peer(target, compile=False).run(
            list(range(20)), sampling=GREEDY, max_new_tokens=NEW, seed=0, eos_token_id=None
        )


@pytest.mark.heavy  # compiles
def test_compiled_on_the_cpu_the_rows_stay_and_one_graph_serves_every_prompt_length(
    target, reference
) -> None:
    """Inductor on the CPU (a few seconds for the tiny model): the same greedy rows and the
    same sampled rows as eager, and one compiled graph for prompts of 2, 4 and 7 tokens (the
    static cache fixes the decode step's shapes)."""
    torch._dynamo.reset()
    counters.clear()
    static = peer(target, compile=True)
    assert static.warm_up(PROMPTS[0], NEW) > 0
    assert rows(static, GREEDY) == reference
    assert counters["stats"]["unique_graphs"] == 1
    eager = rows(peer(target, compile=False), SAMPLED, seed=3)
    assert rows(static, SAMPLED, seed=3) == eager
    assert static.settings()["compile"] is True


@pytest.mark.gpu
def test_on_cuda_the_compiled_graphs_keep_target_onlys_greedy_rows(reference) -> None:
    """reduce-overhead (CUDA graphs) on the reused cache: the CPU's greedy rows."""
    cuda = torch.device("cuda")
    model = build_tiny_model({}, seed=0).to(cuda)
    static = StaticPeer(
        model, max_cache_len=7 + NEW, compile=True, compile_mode="reduce-overhead", device=cuda
    )
    static.warm_up(PROMPTS[0], NEW)
    assert rows(static, GREEDY) == reference


def test_decoding_compile_resolves_and_is_checked() -> None:
    assert resolve_compile("auto", CPU) is False
    assert resolve_compile("auto", torch.device("cuda")) is True
    assert (
        resolve_compile(True, CPU) is True and resolve_compile(False, torch.device("cuda")) is False
    )
    with pytest.raises(ValueError, match="auto, true or false"):
        resolve_compile("maybe", CPU)
    assert resolve_compile("yes", CPU) is True and resolve_compile("off", CPU) is False
    assert decoding_problems({"compile": "auto", "pack_every": PACK_EVERY}) == []
    assert decoding_problems({"compile": True}) == decoding_problems({"compile": False}) == []
    (line,) = config_problems(compose_config("stage=bench", "decoding.compile=maybe"))
    assert "decoding.compile='maybe'" in line and "true or false" in line and "auto" in line
