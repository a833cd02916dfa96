"""transformers' deprecations: our calls use the names the installed version wants (the next
release's breaks are errors here, tests/conftest.py's `_transformers_deprecations`), and that
rule itself fails a deprecated call while it lets through what transformers does to itself."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from conftest import TRANSFORMERS, TransformersDeprecation
from transformers import DynamicCache, GenerationConfig

from sprinter_train.bench.peers.hf_assisted import run_hf_assisted
from sprinter_train.bench.peers.hf_static import StaticPeer
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.models.body import body
from sprinter_train.models.cache import cache_kwarg
from sprinter_train.models.tiny import build_tiny_model

IDS = torch.tensor([[1, 2, 3, 4]])
GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return build_tiny_model({}, seed=0).eval()


def test_a_forward_reads_its_cache_under_the_current_name(model: torch.nn.Module) -> None:
    """harvest's teacher-forced forwards (no cache) read the output's cache without touching
    5.24's deprecated `output.past_key_values`; a cached forward hands its cache back."""
    final, _, cache = body(model, IDS)
    assert cache is None and final.shape[:2] == IDS.shape
    _, _, cache = body(model, IDS, past_key_values=DynamicCache(), use_cache=True)
    assert cache.get_seq_length() == IDS.shape[1]


def test_hf_static_passes_its_cache_under_the_name_generate_takes(model) -> None:
    peer = StaticPeer(
        model, max_cache_len=32, compile=False, compile_mode="default", device=IDS.device
    )
    run = peer.run(IDS[0].tolist(), sampling=GREEDY, max_new_tokens=3, seed=0, eos_token_id=None)
    expected = model.generate(IDS, attention_mask=torch.ones_like(IDS), max_new_tokens=3)
    assert run.tokens == expected[0, IDS.shape[1] :].tolist()


def test_a_deprecated_call_of_ours_is_an_error(model: torch.nn.Module) -> None:
    with pytest.raises(TransformersDeprecation, match="generation_config"):  # logged
        model.generate(IDS, generation_config=GenerationConfig(max_new_tokens=2), min_new_tokens=1)
    if cache_kwarg(model.base_model) == "cache":  # 5.24 on: the old name is deprecated
        with pytest.raises(TransformersDeprecation, match="past_key_values"):
            model.base_model(input_ids=IDS, past_key_values=DynamicCache(), use_cache=True)
    # warned: a FutureWarning raised in transformers' code, not one raised elsewhere
    code = "import warnings; warnings.warn('`x` is deprecated', FutureWarning, stacklevel=2)"
    with pytest.raises(TransformersDeprecation, match="`x` is deprecated"):
        exec(compile(code, TRANSFORMERS + "fake_module.py", "exec"))
    with pytest.warns(FutureWarning, match="`x` is deprecated"):
        exec(compile(code, __file__, "exec"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning):  # any other warning of transformers' is untouched
            exec(compile("import warnings; warnings.warn('x')", TRANSFORMERS + "m.py", "exec"))


def test_transformers_own_deprecated_call_in_assisted_generation_passes(model) -> None:
    """The HF assisted peer passes generation parameters alone; transformers' assistant call
    (generation_config with min/max_new_tokens) logs a deprecation that is not ours."""
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        run = run_hf_assisted(
            model, build_tiny_model({}, seed=0).eval(), IDS[0].tolist(), sampling=GREEDY,
            max_new_tokens=4, schedule="constant", num_assistant_tokens=2, seed=0,
            eos_token_id=None, device=IDS.device,
        )  # fmt: skip
    finally:
        logger.removeHandler(handler)
    assert len(run.tokens) == 4
    assert any("generation_config" in m and "deprecated" in m for m in seen)
