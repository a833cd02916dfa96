"""Every model family the loader accepts, built from a config shaped like the hub's.

Tiny random models of each family, configured with only the fields the family's hub configs
carry (no `head_dim` where the hub leaves it out: Qwen2, Mistral, Phi-3, GPT-2, GPT-NeoX),
decode greedy `target_only`, `sd` and `sv` (its companion of another family) in the dynamic,
static and host-captured layouts with identical tokens, and through the HF callables. A
family the engine cannot run is refused when it loads, naming the family.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from sprinter_train import hf
from sprinter_train.decoding.builder import build_engine
from sprinter_train.decoding.cache.static import StaticRowCache
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import (
    SVIP,
    SpeculativeDecoding,
    SpecVerification,
    TargetOnly,
)
from sprinter_train.decoding.runner import capture as graphs
from sprinter_train.models.families import TESTED_FAMILIES, UnsupportedModelError, kv_layout
from sprinter_train.models.loading import ModelLoadError, load_model
from sprinter_train.models.tiny import build_tiny_tokenizer
from tests.decoding_helpers import GREEDY, PACK_EVERY, ATable, fixed_timings

VOCAB = 128
IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
LLAMA_LIKE = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
# each family's config as its hub configs write it, at a tiny size: the fields they leave out
# stay out (the model then derives them, as it does for the hub's)
HUB_SHAPED: dict[str, dict[str, Any]] = {
    "llama": {**LLAMA_LIKE, "num_attention_heads": 4, "num_key_value_heads": 2},  # SmolLM2
    "qwen2": {**LLAMA_LIKE, "num_attention_heads": 2, "num_key_value_heads": 1},
    "qwen3": {**LLAMA_LIKE, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16},
    "mistral": {**LLAMA_LIKE, "num_attention_heads": 4, "num_key_value_heads": 2},
    "gemma": {**LLAMA_LIKE, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32},
    "gemma2": {**LLAMA_LIKE, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32},
    "phi3": {**LLAMA_LIKE, "num_attention_heads": 4, "num_key_value_heads": 4},
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 2},
    "gpt_neox": {**LLAMA_LIKE, "num_attention_heads": 2},
}
FAMILIES = list(HUB_SHAPED)
PROMPTS = [[1, 40, 41, 42, 43, 44, 45], [1, 50, 51, 52], [1, 60, 61, 62, 63, 64]]
NEW_TOKENS = 10


def build(family: str, seed: int) -> PreTrainedModel:
    """A tiny random model of `family` from its hub-shaped config (float32, eval)."""
    config = AutoConfig.for_model(family, vocab_size=VOCAB, **IDS, **HUB_SHAPED[family])
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def near_copy(model: PreTrainedModel, family: str, scale: float, seed: int) -> PreTrainedModel:
    """The same family's model with seeded noise on its weights: a draft that agrees often."""
    copy = build(family, seed)
    copy.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in copy.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return copy


@pytest.fixture(scope="module", params=FAMILIES)
def trio(request) -> dict[str, Any]:
    """Target and draft of the family, a companion of the next family in the list."""
    family = request.param
    target = build(family, 0)
    other = FAMILIES[(FAMILIES.index(family) + 1) % len(FAMILIES)]
    return {
        "family": family,
        "target": target,
        "draft": near_copy(target, family, 0.02, 1),
        "companion": build(other, 2),
    }


def engine(trio: dict[str, Any], **layout: bool) -> Engine:
    return build_engine(
        trio["target"],
        GREEDY,
        VOCAB,
        draft=trio["draft"],
        companion=trio["companion"],
        layout=layout,
        pack_every=PACK_EVERY,
        timings=fixed_timings(),
    )


def policies() -> list:
    return [TargetOnly(), SpeculativeDecoding(gamma=3), SpecVerification(ATable(), max_gamma=4)]


def tokens(engine_: Engine) -> list[list[list[int]]]:
    return [[r.tokens for r in engine_.generate(PROMPTS, p, NEW_TOKENS)] for p in policies()]


def test_the_matrix_covers_every_tested_family() -> None:
    assert set(FAMILIES) | {"sprinter_draft"} == set(TESTED_FAMILIES)


def test_the_kv_layout_is_read_from_the_model(trio) -> None:
    """The head dimension the model writes, whether or not its config names one."""
    target = trio["target"]
    attention_heads = getattr(target.config, "num_attention_heads", None) or target.config.n_head
    hidden = target.config.hidden_size
    declared = getattr(target.config, "head_dim", None)
    layout = kv_layout(target)
    assert layout.head_dims == [declared or hidden // attention_heads] * 2


def test_every_layout_emits_the_same_tokens(trio, monkeypatch) -> None:
    dynamic = tokens(engine(trio))
    static = engine(trio, static=True)
    caches = static.new_batch(PROMPTS, 1, range(len(PROMPTS))).caches
    assert all(isinstance(cache, StaticRowCache) for cache in caches.values()), trio["family"]
    assert tokens(static) == dynamic
    monkeypatch.setattr(graphs, "CudaGraph", graphs.HostGraph)
    captured = engine(trio, static=True, captured=True)
    assert tokens(captured) == dynamic
    assert all(r.layout == "static:captured" for r in captured.present_runners.values())


def test_the_hf_callable_emits_the_engines_tokens(trio) -> None:
    policy = SVIP(h=0.5, c=0.15, max_gamma=8)
    ours = engine(trio).generate([PROMPTS[0]], policy, NEW_TOKENS)[0].tokens
    out = hf.svip(
        trio["target"],
        input_ids=torch.tensor([PROMPTS[0]]),
        assistant_model=trio["draft"],
        max_new_tokens=NEW_TOKENS,
    )
    assert out[0, len(PROMPTS[0]) :].tolist() == ours


def test_a_family_the_engine_cannot_run_is_refused_at_load(tmp_path) -> None:
    """Mamba keeps a state, not per-layer keys and values: refused by name when it loads."""
    config = AutoConfig.for_model(
        "mamba", vocab_size=VOCAB, hidden_size=16, state_size=4, num_hidden_layers=1, **IDS
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    build_tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="mamba models cannot run on the decoding engine"):
        load_model({"path": str(tmp_path)}, "target", torch.device("cpu"), torch.float32)
    with pytest.raises(UnsupportedModelError, match="mamba"):
        kv_layout(AutoModelForCausalLM.from_config(config))


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_a_sliding_window_shorter_than_the_text_keeps_hf_generates_tokens(family) -> None:
    """Sliding-window layers run as full-attention buffers under the model's own windowed
    mask: with a window of 4 over a 9-token prompt and 10 new tokens, every layout emits
    transformers' greedy `generate`."""
    config = AutoConfig.for_model(
        family, vocab_size=VOCAB, **IDS, **{**HUB_SHAPED[family], "sliding_window": 4}
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    prompt = PROMPTS[0] + [46, 47]
    reference = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
    expected = reference[0, len(prompt) :].tolist()
    trio = {"target": model, "draft": model, "companion": model}
    for layout in ({}, {"static": True}):
        for policy in (TargetOnly(), SpeculativeDecoding(gamma=3)):
            out = engine(trio, **layout).generate([prompt], policy, NEW_TOKENS)
            assert out[0].tokens == expected, (layout, policy.name)
