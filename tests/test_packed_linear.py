"""Prepacked linears (`models.packed`): the same values as F.linear, bit for bit, at inference;
plain F.linear (and gradients) wherever autograd records; repacked when the weight changes;
the module's parameters, state_dict and tied weights untouched."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from transformers import DynamicCache

from sprinter_train.models.body import body, head_logits
from sprinter_train.models.lean import packs
from sprinter_train.models.packed import PackedLinear, pack_linears
from sprinter_train.models.roles import load_roles
from sprinter_train.models.tiny import build_tiny_model

native_bf16 = pytest.mark.skipif(
    not packs(torch.zeros(1, dtype=torch.bfloat16)),
    reason="this CPU's oneDNN has no native bf16: pack_linears leaves every linear plain",
)


def tiny_pair(**overrides) -> tuple[nn.Module, nn.Module]:
    """A tiny bf16 Llama and a copy of it with its linears packed."""
    plain = build_tiny_model({"num_hidden_layers": 2, **overrides}, seed=0).to(torch.bfloat16)
    packed = copy.deepcopy(plain)
    assert pack_linears(packed) == 2 * 7 + 1  # q k v o gate up down a layer, and the head
    return plain, packed


def packed_copies(model: nn.Module) -> list[torch.Tensor | None]:
    return [m._packed for m in model.modules() if isinstance(m, PackedLinear)]


@native_bf16
def test_logits_equal_plain_bit_for_bit_through_a_kv_cache() -> None:
    """A prefill, then blocks of 1 and 3 tokens over 2 rows (the engine's verify shapes)."""
    plain, packed = tiny_pair()
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(0, 128, (2, 20), generator=gen)
    blocks = [torch.randint(0, 128, (2, w), generator=gen) for w in (1, 3, 2)]
    outputs = []
    for model in (plain, packed):
        with torch.inference_mode():
            kv = DynamicCache()
            final, _, kv = body(model, context, past_key_values=kv, use_cache=True)
            logits = [head_logits(model, final, 128)]
            for block in blocks:
                final, _, kv = body(model, block, past_key_values=kv, use_cache=True)
                logits.append(head_logits(model, final, 128))
        outputs.append(logits)
    assert all(torch.equal(a, b) for a, b in zip(*outputs, strict=True))
    assert all(c is not None and c.is_mkldnn for c in packed_copies(packed))


@native_bf16
def test_generate_gives_the_plain_models_tokens() -> None:
    plain, packed = tiny_pair()
    prompt = torch.tensor([[5, 17, 9, 33, 40]])
    runs = [
        m.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=2)
        for m in (plain, packed)
    ]
    assert torch.equal(runs[0], runs[1])
    assert all(c is not None for c in packed_copies(packed))


@native_bf16
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 64), (3, 5, 64), (2, 1, 4, 64), (0, 64)])
def test_one_layer_matches_f_linear(bias: bool, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(64, 96, bias=bias).to(torch.bfloat16)
    pack_linears(layer)
    x = torch.randn(shape, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert layer._packed is not None and layer._packed.is_mkldnn


@native_bf16
def test_gradients_flow_through_f_linear_when_autograd_records() -> None:
    plain, packed = tiny_pair()
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    for model in (plain, packed):
        model.zero_grad()
        model(ids, labels=ids).loss.backward()
    grads = [{k: p.grad for k, p in m.named_parameters()} for m in (plain, packed)]
    assert all(g is not None for g in grads[1].values())
    assert all(torch.equal(grads[0][k], grads[1][k]) for k in grads[0])
    assert all(c is None for c in packed_copies(packed))  # training never packed a copy


@native_bf16
def test_frozen_weights_pack_only_while_the_input_needs_no_gradient() -> None:
    """A frozen teacher under grad mode takes the packed path; an input that requires grad
    (a gradient through a frozen layer) goes through F.linear and gets its gradient."""
    torch.manual_seed(0)
    layer = nn.Linear(64, 32, bias=False).to(torch.bfloat16).requires_grad_(False)
    pack_linears(layer)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, layer.weight))
    assert layer._packed is not None
    x.requires_grad_(True)
    layer(x).sum().backward()
    assert x.grad is not None
    assert torch.equal(x.grad, layer.weight.sum(0).expand(4, -1))


@native_bf16
def test_a_changed_weight_is_repacked() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(64, 32).to(torch.bfloat16)
    pack_linears(layer)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(-2)  # in place: a new version
    with torch.inference_mode():
        after = layer(x)
    assert not torch.equal(before, after)
    assert torch.equal(after, F.linear(x, layer.weight, layer.bias))
    replacement = {k: torch.randn_like(v) for k, v in layer.state_dict().items()}
    layer.load_state_dict(replacement)
    with torch.inference_mode():
        assert torch.equal(layer(x), F.linear(x, replacement["weight"], replacement["bias"]))


@native_bf16
def test_casts_drop_the_copy_and_repack_in_bf16() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(64, 32).to(torch.bfloat16)
    pack_linears(layer)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        layer(x)
        layer.float()
        assert layer._packed is None
        assert torch.equal(layer(x.float()), F.linear(x.float(), layer.weight, layer.bias))
        assert layer._packed is None  # float32 keeps F.linear
        layer.to(torch.bfloat16)
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
        assert layer._packed is not None and layer._packed.is_mkldnn


@native_bf16
def test_parameters_state_dict_and_tied_weights_unchanged() -> None:
    plain, packed = tiny_pair(tie_word_embeddings=True)
    before = {k: v for k, v in packed.state_dict().items()}
    params = {k: p for k, p in packed.named_parameters()}
    with torch.inference_mode():
        packed(torch.tensor([[1, 2, 3]]))
    assert list(packed.state_dict()) == list(plain.state_dict())
    assert all(v is before[k] or torch.equal(v, before[k]) for k, v in packed.state_dict().items())
    assert {k: p for k, p in packed.named_parameters()} == params
    assert packed.lm_head.weight is packed.model.embed_tokens.weight
    assert isinstance(packed.lm_head, nn.Linear)


@native_bf16
def test_copies_and_pickles_leave_the_packed_copy_out() -> None:
    _, packed = tiny_pair()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        expected = packed(ids).logits
    twin = copy.deepcopy(packed)
    buffer = io.BytesIO()
    torch.save(packed, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for model in (twin, loaded):
        assert all(c is None for c in packed_copies(model))
        with torch.inference_mode():
            assert torch.equal(model(ids).logits, expected)


def test_float32_and_linear_subclasses_stay_plain() -> None:
    """Without a bf16 weight on a CPU with native bf16 nothing is swapped (no per-call check
    elsewhere); subclasses of nn.Linear keep their own forward."""

    class Scaled(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    model = nn.Sequential(nn.Linear(8, 8), Scaled(8, 8).to(torch.bfloat16))
    expected = 1 if packs(model[1].weight) else 0  # only a plain bf16 nn.Linear packs
    model[0].to(torch.bfloat16)
    assert pack_linears(model) == expected
    assert type(model[1]) is Scaled
    assert pack_linears(build_tiny_model({}, seed=0)) == 0  # float32


@native_bf16
@pytest.mark.parametrize("switch", [True, False])
def test_harvest_models_follow_the_config_switch(compose_cfg, switch: bool) -> None:
    cfg = compose_cfg("models=tiny_random", f"models.pack_linear={switch}")
    models = load_roles(cfg.models, torch.device("cpu"), torch.bfloat16)
    for loaded in models.all():
        kinds = {type(m) for m in loaded.model.modules() if isinstance(m, nn.Linear)}
        assert kinds == ({PackedLinear} if switch else {nn.Linear})
