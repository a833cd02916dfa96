"""Prepacked linears (`models.packed`): the same values as F.linear at inference (bf16: bit
for bit; float32: to a few ulps, oneDNN sums in another order), a row's values independent of
the rows beside it; plain F.linear (and gradients) wherever autograd records; repacked when
the weight changes; the module's parameters, state_dict and tied weights untouched."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from transformers import DynamicCache

from sprinter_train.models import packed as packed_module
from sprinter_train.models.body import body, head_logits
from sprinter_train.models.packed import PackedLinear, pack_linears, packed_linear
from sprinter_train.models.roles import load_roles
from sprinter_train.models.tiny import build_tiny_model
from sprinter_train.models.weight_packing import packs

native_bf16 = pytest.mark.skipif(
    not packs(torch.zeros(1, dtype=torch.bfloat16)),
    reason="this CPU's oneDNN has no native bf16: pack_linears leaves bf16 linears plain",
)
# every dtype `packs` takes: float32 wherever oneDNN is, bf16 on a CPU with native bf16
DTYPES = [
    pytest.param(torch.bfloat16, marks=native_bf16, id="bf16"),
    pytest.param(torch.float32, id="f32"),
]


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """bf16: bit for bit (both are oneDNN products); float32: F.linear is MKL's sgemm, which
    sums in another order than oneDNN, so a few ulps apart."""
    if actual.dtype == torch.bfloat16:
        assert torch.equal(actual, expected)
    else:
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def tiny_pair(dtype: torch.dtype, **overrides) -> tuple[nn.Module, nn.Module]:
    """A tiny Llama in `dtype` and a copy of it with its linears packed."""
    plain = build_tiny_model({"num_hidden_layers": 2, **overrides}, seed=0).to(dtype)
    packed = copy.deepcopy(plain)
    assert pack_linears(packed) == 2 * 7 + 1  # q k v o gate up down a layer, and the head
    return plain, packed


def packed_copies(model: nn.Module) -> list[torch.Tensor | None]:
    return [m._packed for m in model.modules() if isinstance(m, PackedLinear)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_logits_equal_plain_through_a_kv_cache(dtype: torch.dtype) -> None:
    """A prefill, then blocks of 1 and 3 tokens over 2 rows (the engine's verify shapes)."""
    plain, packed = tiny_pair(dtype)
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
    for a, b in zip(*outputs, strict=True):
        assert_same(b, a)
    assert all(c is not None and c.is_mkldnn for c in packed_copies(packed))


@pytest.mark.parametrize("dtype", DTYPES)
def test_generate_gives_the_plain_models_tokens(dtype: torch.dtype) -> None:
    plain, packed = tiny_pair(dtype)
    prompt = torch.tensor([[5, 17, 9, 33, 40]])
    runs = [
        m.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=2)
        for m in (plain, packed)
    ]
    assert torch.equal(runs[0], runs[1])
    assert all(c is not None for c in packed_copies(packed))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 64), (3, 5, 64), (2, 1, 4, 64), (0, 64)])
def test_one_layer_matches_f_linear(bias: bool, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(64, 96, bias=bias).to(dtype)
    pack_linears(layer)
    x = torch.randn(shape, dtype=dtype)
    with torch.no_grad():
        assert_same(layer(x), F.linear(x, layer.weight, layer.bias))
    assert layer._packed is not None and layer._packed.is_mkldnn


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_flow_through_f_linear_when_autograd_records(dtype: torch.dtype) -> None:
    plain, packed = tiny_pair(dtype)
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    for model in (plain, packed):
        model.zero_grad()
        model(ids, labels=ids).loss.backward()
    grads = [{k: p.grad for k, p in m.named_parameters()} for m in (plain, packed)]
    assert all(g is not None for g in grads[1].values())
    assert all(torch.equal(grads[0][k], grads[1][k]) for k in grads[0])
    assert all(c is None for c in packed_copies(packed))  # training never packed a copy


@pytest.mark.parametrize("dtype", DTYPES)
def test_frozen_weights_pack_only_while_the_input_needs_no_gradient(dtype: torch.dtype) -> None:
    """A frozen teacher under grad mode takes the packed path; an input that requires grad
    (a gradient through a frozen layer) goes through F.linear and gets its gradient."""
    torch.manual_seed(0)
    layer = nn.Linear(64, 32, bias=False).to(dtype).requires_grad_(False)
    pack_linears(layer)
    x = torch.randn(4, 64, dtype=dtype)
    assert_same(layer(x), F.linear(x, layer.weight))
    assert layer._packed is not None
    x.requires_grad_(True)
    layer(x).sum().backward()
    assert x.grad is not None
    assert_same(x.grad, layer.weight.sum(0).expand(4, -1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_changed_weight_is_repacked(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(64, 32).to(dtype)
    pack_linears(layer)
    x = torch.randn(3, 64, dtype=dtype)
    with torch.inference_mode():
        before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(-2)  # in place: a new version
    with torch.inference_mode():
        after = layer(x)
    assert not torch.equal(before, after)
    assert_same(after, F.linear(x, layer.weight, layer.bias))
    replacement = {k: torch.randn_like(v) for k, v in layer.state_dict().items()}
    layer.load_state_dict(replacement)
    with torch.inference_mode():
        assert_same(layer(x), F.linear(x, replacement["weight"], replacement["bias"]))


@pytest.mark.heavy  # compiles
def test_a_compiled_forward_multiplies_by_the_packed_copy_at_any_row_count(monkeypatch) -> None:
    """The compiled graph (dynamo's automatic dynamic shapes, as `decoding.compile` on a CPU)
    calls the module's packed copy through the custom op with no graph break, at the engine's
    1-8 rows, and follows an in-place change of the weight without recompiling."""
    torch.manual_seed(0)
    layer = nn.Linear(64, 32)
    pack_linears(layer)
    reads = []
    packed_weight = PackedLinear.packed_weight
    monkeypatch.setattr(
        PackedLinear, "packed_weight", lambda self: reads.append(1) or packed_weight(self)
    )
    explained = torch._dynamo.explain(layer)(torch.randn(2, 3, 64))
    assert explained.graph_break_count == 0
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, dynamic=None)
    with torch.inference_mode():
        for rows in (1, 2, 4, 8):
            x = torch.randn(rows, 3, 64)
            before = len(reads)
            assert_same(compiled(x), F.linear(x, layer.weight, layer.bias))
            assert len(reads) > before  # the op ran on the packed copy
    with torch.no_grad():
        layer.weight.mul_(-2)
    with torch.inference_mode():
        x = torch.randn(4, 3, 64)
        assert_same(compiled(x), F.linear(x, layer.weight, layer.bias))


def test_the_op_takes_a_packed_copy_only_from_the_weights_owner() -> None:
    """A weight no live packed module holds (a replaced parameter, a stray tensor, a dead
    module's) goes through F.linear, never through another weight's copy."""
    torch.manual_seed(0)
    layer = nn.Linear(64, 32)
    pack_linears(layer)
    x = torch.randn(3, 64)
    stray, old = torch.randn(32, 64), layer.weight
    with torch.no_grad():
        layer(x)  # builds the copy
        assert_same(packed_linear(x, stray, None), F.linear(x, stray))
        layer.weight = nn.Parameter(torch.randn(32, 64))
        assert_same(
            packed_linear(x, layer.weight, layer.bias), F.linear(x, layer.weight, layer.bias)
        )
        assert_same(packed_linear(x, old, layer.bias), F.linear(x, old, layer.bias))
    key = layer.weight.data_ptr()
    with torch.no_grad():
        layer(x)  # packs and registers the new weight
    assert key in packed_module._OWNERS
    del layer
    assert key not in packed_module._OWNERS


def test_casts_drop_the_copy_and_repack() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(64, 32)
    pack_linears(layer)
    x = torch.randn(3, 64)
    with torch.no_grad():
        layer(x)
        assert layer._packed is not None and layer._packed.dtype == torch.float32
        layer.double()
        assert layer._packed is None
        assert torch.equal(layer(x.double()), F.linear(x.double(), layer.weight, layer.bias))
        assert layer._packed is None  # float64 keeps F.linear
        layer.float()
        assert_same(layer(x), F.linear(x, layer.weight, layer.bias))
        assert layer._packed is not None and layer._packed.is_mkldnn


@pytest.mark.parametrize("dtype", DTYPES)
def test_parameters_state_dict_and_tied_weights_unchanged(dtype: torch.dtype) -> None:
    plain, packed = tiny_pair(dtype, tie_word_embeddings=True)
    before = {k: v for k, v in packed.state_dict().items()}
    params = {k: p for k, p in packed.named_parameters()}
    with torch.inference_mode():
        packed(torch.tensor([[1, 2, 3]]))
    assert list(packed.state_dict()) == list(plain.state_dict())
    assert all(v is before[k] or torch.equal(v, before[k]) for k, v in packed.state_dict().items())
    assert {k: p for k, p in packed.named_parameters()} == params
    assert packed.lm_head.weight is packed.model.embed_tokens.weight
    assert isinstance(packed.lm_head, nn.Linear)


@pytest.mark.parametrize("dtype", DTYPES)
def test_copies_and_pickles_leave_the_packed_copy_out(dtype: torch.dtype) -> None:
    _, packed = tiny_pair(dtype)
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


def test_other_dtypes_and_linear_subclasses_stay_plain() -> None:
    """Only weights `packs` takes are swapped (no per-call check elsewhere: float64 here);
    subclasses of nn.Linear keep their own forward."""

    class Scaled(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    model = nn.Sequential(nn.Linear(8, 8).double(), Scaled(8, 8), nn.Linear(8, 8))
    assert pack_linears(model) == 1  # only the plain float32 nn.Linear
    assert [type(m) for m in model] == [nn.Linear, Scaled, PackedLinear]
    assert pack_linears(build_tiny_model({}, seed=0).double()) == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_rows_values_do_not_depend_on_the_rows_beside_it(dtype: torch.dtype) -> None:
    """What lets the float32 engine keep its guarantee that a row's tokens depend only on its
    prompt and seed: a packed product of one row gives that row's values bit for bit at every
    block size (MKL's sgemm behind F.linear does not promise it: its kernel changes with the
    row count), and a 1-token step equals the same token inside a verify block."""
    torch.manual_seed(0)
    layer = nn.Linear(576, 1536, bias=False).to(dtype)
    pack_linears(layer)
    x = torch.randn(16, 576, dtype=dtype)
    with torch.inference_mode():
        alone = layer(x[:1])
        for rows in (2, 3, 4, 5, 8, 16):
            assert torch.equal(layer(x[:rows])[:1], alone), rows


@pytest.mark.parametrize("switch", [True, False])
def test_harvest_models_follow_the_config_switch(compose_cfg, switch: bool) -> None:
    cfg = compose_cfg("models=tiny_random", f"models.pack_linear={switch}")
    models = load_roles(cfg.models, torch.device("cpu"), torch.float32)
    for loaded in models.all():
        kinds = {type(m) for m in loaded.model.modules() if isinstance(m, nn.Linear)}
        assert kinds == ({PackedLinear} if switch else {nn.Linear})
