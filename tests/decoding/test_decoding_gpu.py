"""The engine on CUDA: the same tokens as on the CPU, streams and caches on the device, and a
time breakdown from CUDA events (skipped without a GPU)."""

from __future__ import annotations

import pytest

from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.decoding.builder import build_engine, build_runner
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import MTAD, SVIP, SpeculativeDecoding, TargetOnly
from sprinter_train.models.tiny import build_tiny_model
from tests.decoding_helpers import PACK_EVERY, PREFILL_TOKENS

pytestmark = pytest.mark.gpu
VOCAB = 128
PROMPTS = [[5, 17, 9, 33], [40, 41, 42, 43, 44, 45, 46], [7, 8]]
PADDED = {"prefill_tokens": PREFILL_TOKENS}  # the runners' default on CUDA pads the prefill


def engine_on(device: str, sampling: SamplingConfig) -> Engine:
    target = build_tiny_model({}, seed=0).to(device)
    draft = build_tiny_model({"num_hidden_layers": 1}, seed=1).to(device)
    return build_engine(
        build_runner(target, VOCAB, PADDED),
        sampling,
        VOCAB,
        draft=build_runner(draft, VOCAB, PADDED),
        pack_every=PACK_EVERY,
    )


@pytest.mark.parametrize(
    "policy",
    [TargetOnly(), SpeculativeDecoding(3), SVIP(0.5, 4, 0.15), MTAD(3, 3, 0.5)],
    ids=lambda p: p.name,
)
def test_greedy_rows_on_cuda_equal_the_cpu(policy) -> None:
    greedy = SamplingConfig(temperature=0)
    cpu = engine_on("cpu", greedy).generate(PROMPTS, policy, 24)
    cuda = engine_on("cuda", greedy).generate(PROMPTS, policy, 24)
    assert [r.tokens for r in cuda] == [r.tokens for r in cpu]


def test_cuda_times_come_from_events_and_streams_stay_on_the_device() -> None:
    engine = engine_on("cuda", SamplingConfig(temperature=0.9, top_k=8))
    batch = engine.new_batch(PROMPTS, 8, [0, 1, 2])
    assert batch.streams.keys.device.type == "cuda"
    result = engine.generate(PROMPTS, SpeculativeDecoding(3), 16)
    assert result[0].stats.target_seconds > 0 and result[0].stats.draft_seconds > 0
    assert result[0].stats.target_seconds + result[0].stats.draft_seconds < 2 * result[0].wall_s


def test_the_lean_restricted_draft_runs_on_cuda_and_keeps_the_greedy_rows() -> None:
    """The distilled draft's lean forward (static KV buffers, head-only warping) on CUDA:
    greedy sd rows equal target-only on the CPU, and sampling stays on the device."""
    target = build_tiny_model({}, seed=0)
    draft = build_tiny_model({"head_vocab_size": 64, "embed_rank": 8}, seed=2)
    greedy = SamplingConfig(temperature=0)
    cpu = build_engine(build_runner(target, VOCAB), greedy, VOCAB, pack_every=PACK_EVERY).generate(
        PROMPTS, TargetOnly(), 24
    )
    runner = build_runner(draft.to("cuda"), VOCAB, PADDED, lean=True)
    cuda = build_engine(
        build_runner(target.to("cuda"), VOCAB, PADDED),
        greedy,
        VOCAB,
        draft=runner,
        pack_every=PACK_EVERY,
    )
    rows = cuda.generate(PROMPTS, SpeculativeDecoding(3), 24)
    assert [r.tokens for r in rows] == [r.tokens for r in cpu]
    sampled = build_engine(
        cuda.runners["target"],
        SamplingConfig(temperature=0.9, top_p=0.9),
        VOCAB,
        draft=runner,
        pack_every=PACK_EVERY,
    )
    assert all(len(r.tokens) == 24 for r in sampled.generate(PROMPTS, SpeculativeDecoding(3), 24))
