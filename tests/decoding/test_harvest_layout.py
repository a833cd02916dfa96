"""Harvest's continuations run on the bench's engine layout, one runner per model a harvest.

The static KV layout (and its compiled forward) must not change a token of any generated mix
(float32), and the runners are built once and reused by every batch: a compiled runner keeps
its graphs and a static one its KV buffers (`KVPool`), which a runner per batch would lose.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding import builder
from sprinter_train.decoding.cache.static import KVPool
from sprinter_train.decoding.runner.runner import ModelRunner
from sprinter_train.harvest.continuations import (
    GENERATED_MIXES,
    ContinuationRunners,
    RunLaw,
    build_sequences,
    continuation_engine,
)
from sprinter_train.models.roles import Roles
from tests.decoding_helpers import PACK_EVERY, PREFILL_TOKENS
from tests.harvest_helpers import default_runners, generating_models

PROMPTS = [
    Prompt(f"p{i}", "toy", "train", "", [1, *range(40 + i, 42 + i + (5 * i) % 9)], None)
    for i in range(8)
]
MIXES = [GENERATED_MIXES[i % 4] for i in range(len(PROMPTS))]
SAMPLING = SamplingConfig(temperature=1.0, top_k=40, top_p=0.95)
RUNS = RunLaw(accept=0.6, max_run=3)
TOKENS = 10


def sequences(
    models: Roles,
    runners: ContinuationRunners | None,
    prompts: list[Prompt] = PROMPTS,
    mixes: list[str] = MIXES,
    shared_rows: int = 8,
) -> list[tuple[str, list[int], tuple[bool, ...]]]:
    """Each row's mix, full sequence and draft flags, built as the harvest builds them, on
    `runners` (None: new ones in the runners' default layout)."""
    built = build_sequences(
        models,
        prompts,
        mixes,
        TOKENS,
        TOKENS,
        3,
        RUNS,
        SAMPLING,
        0,
        shared_rows,
        runners=default_runners(models) if runners is None else runners,
    )
    return [(seq.mix, seq.input_ids, seq.from_draft) for seq in built]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("shared_rows", [0, 8])
def test_the_static_layout_emits_the_default_layouts_sequences(family, shared_rows) -> None:
    """Every generated mix (draft, target, interleaved with and without target rows in its
    call, sd_interleaved), rows of different prompt lengths: the static layout run eagerly
    (with `runner_layout`'s other keys) builds exactly the default layout's sequences."""
    models = generating_models(family, None)
    layout = {
        "static": True,
        "compiled": False,
        "min_capacity": 0,
        "prefill_tokens": PREFILL_TOKENS,
    }
    static = ContinuationRunners(models, layout, pack_every=3)
    built = sequences(models, static, shared_rows=shared_rows)
    assert built == sequences(models, None, shared_rows=shared_rows)
    assert {static.runner(role).layout for role in ("draft", "target")} == {"static"}
    lengths = [len(ids) - len(p.input_ids) for (_, ids, _), p in zip(built, PROMPTS, strict=True)]
    assert lengths == [TOKENS] * len(PROMPTS)
    # the mixes really differ: the draft, the target and their interleavings
    assert len({tuple(ids) for _, ids, _ in built}) == len(built)


def test_runners_are_built_once_and_reused_by_every_batch(monkeypatch) -> None:
    """Two batches of every mix on one `ContinuationRunners`: one runner per model in all,
    every engine on those runners, and the second batch's static caches take the buffers
    the first batch's gave back to the runners' pools (no new allocation of those shapes)."""
    models = generating_models("llama", None)
    built: list[ModelRunner] = []

    class Counted(ModelRunner):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    taken: list[bool] = []
    take = KVPool.take

    def counted_take(pool: KVPool, key: tuple[int, int]):
        kv = take(pool, key)
        taken.append(kv is not None)
        return kv

    monkeypatch.setattr(builder, "ModelRunner", Counted)  # every runner comes from there
    monkeypatch.setattr(KVPool, "take", counted_take)
    runners = ContinuationRunners(models, {"static": True}, pack_every=PACK_EVERY)
    first = sequences(models, runners)
    gc.collect()  # the finished caches give their buffers back
    first_takes, taken[:] = list(taken), []
    second = sequences(models, runners)
    assert len(built) == 2 and all(len(runner.kv_pool) > 0 for runner in built)
    # a fresh pool has nothing for the first batch's first cache; the second batch's first
    # cache takes buffers the first batch gave back, and it allocates less in all
    assert not first_takes[0] and taken[0] and sum(taken) > sum(first_takes)
    assert second == first  # the same prompts and seeds: reuse changes no token
    engines = [
        continuation_engine(models, [mix], 3, RUNS, SAMPLING, runners)[0] for mix in MIXES[:4]
    ]
    assert {id(e.target) for e in engines} | {id(e.draft) for e in engines if e.draft} == {
        id(r) for r in built
    }
    assert {id(runners.runner(role)) for role in ("draft", "target")} == {id(r) for r in built}


def test_runners_of_other_models_are_refused() -> None:
    models, others = generating_models("llama", None), generating_models("llama", None)
    with pytest.raises(ValueError, match="other models"):
        sequences(models, default_runners(others))


@pytest.mark.slow
def test_compiled_runners_emit_the_eager_tokens_and_compile_once() -> None:
    """The target and the draft compiled (the static layout; inductor on the CPU): every
    generated mix's sequences equal the eager default layout's, and a second batch of the
    same shapes compiles nothing more (its runners, graphs included, are the first batch's)."""
    models = generating_models("llama", None)
    prompts, mixes = PROMPTS[:4], MIXES[:4]  # every mix once
    eager = sequences(models, None, prompts, mixes)
    runners = ContinuationRunners(
        models, {"static": True, "compiled": True, "min_capacity": 64}, pack_every=PACK_EVERY
    )
    assert sequences(models, runners, prompts, mixes) == eager
    compiled = [runners.runner(role) for role in ("draft", "target")]
    assert all(r.compiled and r.compile_seconds > 0 for r in compiled)
    spent = [r.compile_seconds for r in compiled]
    assert sequences(models, runners, prompts, mixes) == eager
    assert [r.compile_seconds for r in compiled] == spent
