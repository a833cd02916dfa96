"""The draft step's floor: the matmul chain covers exactly the weights a step multiplies by,
and the floor, model, engine and target steps are all timed (no timing is asserted)."""

from __future__ import annotations

import pytest
import torch

from sprinter_train.bench.timing.step_floor import (
    WARMUP_ROUNDS,
    EngineDraftStep,
    MatmulChain,
    interleaved_medians,
    measure_step_floor,
    step_weights,
)
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.models.tiny import TINY_DEFAULTS, build_tiny_model
from tests.decoding_helpers import DECODING


def linear_parameters(settings: dict, head_rows: int, embed_rank: int | None) -> int:
    """A Llama's projection weights per layer (q, k, v, o, gate, up, down), counted from its
    config, plus a factorised embedding's up-projection and the head's rows."""
    d, ff = settings["hidden_size"], settings["intermediate_size"]
    q = settings["num_attention_heads"] * settings["head_dim"]
    kv = settings["num_key_value_heads"] * settings["head_dim"]
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * ff
    return settings["num_hidden_layers"] * per_layer + (embed_rank or 0) * d + head_rows * d


@pytest.mark.parametrize(
    ("overrides", "head_rows"),
    [
        ({}, TINY_DEFAULTS["vocab_size"]),
        ({"head_vocab_size": 64, "embed_rank": 8, "num_hidden_layers": 3}, 64),
    ],
)
def test_the_chain_multiplies_by_every_linear_weight_and_the_head_used_once(
    overrides: dict, head_rows: int
) -> None:
    model = build_tiny_model(overrides)
    settings = {**TINY_DEFAULTS, **overrides}
    chain = MatmulChain(step_weights(model))
    assert chain.parameters == linear_parameters(settings, head_rows, overrides.get("embed_rank"))
    extra = 1 if overrides.get("embed_rank") else 0
    assert len(chain.weights) == 7 * settings["num_hidden_layers"] + 1 + extra
    chain()
    for x, w, out in zip(chain.inputs, chain.weights, chain.outputs, strict=True):
        assert torch.allclose(out, x @ w)


def test_tied_weights_are_streamed_once() -> None:
    model = build_tiny_model({"tie_word_embeddings": True})
    weights = step_weights(model)
    assert len(weights) == 7 * TINY_DEFAULTS["num_hidden_layers"] + 1
    assert sum(w.numel() for w in weights) == linear_parameters(
        TINY_DEFAULTS, TINY_DEFAULTS["vocab_size"], None
    )


def test_the_engine_step_draws_from_the_restricted_head_and_keeps_its_context() -> None:
    draft = build_tiny_model({"head_vocab_size": 64, "embed_rank": 8}, seed=2)
    target = build_tiny_model({"num_hidden_layers": 3}, seed=1)
    sampling = SamplingConfig(temperature=1.0)
    step = EngineDraftStep(draft, target, sampling, list(range(5, 17)), DECODING)
    cache = step.batch.caches["draft"]
    assert cache.slots == 12 and int(cache.lengths[0]) == 12
    for _ in range(3):
        step()
        assert cache.slots == 13
        step.reset()
        assert cache.slots == 12 and int(cache.lengths[0]) == 12
    assert step.batch.stats.draft_calls == 4  # the priming step and three timed ones


def test_rounds_rotate_so_every_step_runs_first_equally_often() -> None:
    calls: list[str] = []
    steps = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    resets = {"b": lambda: calls.append("reset b")}
    medians = interleaved_medians(steps, 3, torch.device("cpu"), resets)
    assert set(medians) == {"a", "b", "c"} and all(m >= 0 for m in medians.values())
    rounds = [[c for c in calls if c != "reset b"][i : i + 3] for i in range(0, 18, 3)]
    assert len(rounds) == 3 + WARMUP_ROUNDS
    assert [r[0] for r in rounds] == ["a", "b", "c", "a", "b", "c"]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    assert calls.count("reset b") == 6 and all(
        calls[i - 1] == "b" for i, c in enumerate(calls) if c == "reset b"
    )


def test_all_four_steps_are_timed_on_tiny_models() -> None:
    draft = build_tiny_model({"head_vocab_size": 64, "embed_rank": 8}, seed=2)
    target = build_tiny_model({"num_hidden_layers": 3}, seed=1)
    floor = measure_step_floor(
        draft, target, SamplingConfig(0.2, 0, 0.9), context=16, reps=3, decoding=DECODING
    )
    report = floor.report()
    for key in ("floor_ms", "model_step_ms", "engine_step_ms", "target_step_ms"):
        assert report[key] > 0
    assert report["engine_over_floor"] == pytest.approx(floor.engine_ms / floor.floor_ms)
    assert report["c_engine"] == pytest.approx(floor.engine_ms / floor.target_ms)
    assert report["c_floor"] == pytest.approx(floor.floor_ms / floor.target_ms)
    settings = {**TINY_DEFAULTS, "head_vocab_size": 64, "embed_rank": 8}
    assert report["floor_parameters"] == linear_parameters(settings, 64, 8)
    assert report["floor_weight_mb"] == pytest.approx(report["floor_parameters"] * 4 / 1e6)
