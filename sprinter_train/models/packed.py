"""nn.Linear layers that multiply by a prepacked oneDNN copy of their weight at inference.

On a CPU with native bf16, F.linear hands oneDNN the plain (out, in) weight on every call;
a copy reordered once into oneDNN's blocked layout (`models.lean.pack`) gives the same values
bit for bit, faster. SmolLM2-135M's forward over a 128-token context on the 2-core EPYC
(avx512_bf16) took 11-25% less time (1.13-1.33x) with its linears packed (`pack_linears`) at
the engine's blocks of 1-16 rows by 1-3 tokens, with bit-identical logits.

In float32, F.linear is MKL's sgemm, whose small-M path is slow: on a 2-core EPYC without
AVX-512 one (1536, 576) product took 147 us for 1 row, 219 for 2 and 315 for 4, and the
(49152, 576) head 11.6 ms for 1 row and 28 ms for 2, so a 2-token verify of SmolLM2-135M cost
1.7x a 1-token step and no speculative method paid. oneDNN's prepacked float32 product took
124 / 100 / 155 us and 5.2 / 5.4 ms: the 2-token verify became 1.05x the step (docs/results/
draft-eval.md). Its values are F.linear's to a few ulps (another summation order), and a
row's values do not depend on how many rows share the call, which sgemm's do not promise.

`LeanDraft` packs the distilled draft's matrices itself; this does the same for any Hugging
Face model's nn.Linear modules, so the target's verify forwards, Hugging Face `generate` and
harvest's forwards get it too.

A packed module stays the same object with the same parameters: state_dict keys, tied
weights, hooks, casts and moves are untouched. The packed copy is only read where no gradient
is needed (no grad mode, or neither input nor parameters require grad): anything that trains
goes through F.linear. It is rebuilt when the weight changed (version counter, storage, dtype
or device), as `LeanDraft` rebuilds its copies.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from sprinter_train.models.lean import pack, packs


class PackedLinear(nn.Linear):
    """An nn.Linear whose inference forwards use a prepacked copy of its weight.

    Made from a plain nn.Linear by `pack_linears` (in place: the module's class changes, its
    parameters do not). The copy is built on the first forward that can use it, so a model
    that only trains never holds one."""

    _packed: torch.Tensor | None
    _stamp: tuple[Any, ...] | None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        # a compiled forward (decoding.compile) traces the plain product: the copy's checks
        # break dynamo's graph, and the compiler chooses its own kernels
        if torch.compiler.is_compiling() or not self._packable(x):
            return F.linear(x, weight, bias)
        stamp = (weight._version, weight.data_ptr(), weight.dtype, weight.device)
        if stamp != self._stamp:
            with torch.no_grad():
                self._packed = pack(weight) if packs(weight) else None
            self._stamp = stamp
        if self._packed is None:
            return F.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, bias, "none", [], "")

    def _packable(self, x: torch.Tensor) -> bool:
        """Whether this call may use the packed copy: no autograd graph would be recorded, no
        autocast would change the dtype, the input has the weight's dtype, and the weight is
        a normal tensor (an inference tensor keeps no version counter to notice changes)."""
        weight, bias = self.weight, self.bias
        if torch.is_grad_enabled() and (
            x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
        ):
            return False
        return (
            x.dtype == weight.dtype
            and not torch.is_autocast_enabled(x.device.type)
            and not weight.is_inference()
        )

    def _apply(self, fn: Any, recurse: bool = True) -> PackedLinear:
        """A cast or move drops the packed copy (its memory) before it is stale."""
        self._packed, self._stamp = None, None
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles leave the packed copy out: oneDNN's opaque tensors have no
        storage to copy; the copy repacks on its first forward."""
        state = super().__getstate__()
        return {**state, "_packed": None, "_stamp": None}


def pack_linears(model: nn.Module) -> int:
    """Turn every plain nn.Linear of `model` whose weight `packs` (float32, or bf16 on a CPU
    with native bf16) into a `PackedLinear`; return how many. Elsewhere (CUDA, other dtypes)
    nothing changes, so those forwards pay no per-call check. Subclasses of nn.Linear keep
    their own forward."""
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear and packs(module.weight):
            module.__class__ = PackedLinear
            module._packed, module._stamp = None, None
            count += 1
    return count
