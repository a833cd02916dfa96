"""nn.Linear layers that multiply by a prepacked oneDNN copy of their weight at inference.

On a CPU with native bf16, F.linear hands oneDNN the plain (out, in) weight on every call;
a copy reordered once into oneDNN's blocked layout (`models.lean.pack`) gives the same values
bit for bit, faster at the engine's blocks of a few rows by a few tokens, with bit-identical
logits (docs/results/design-figures.md, "Prepacked linears").

In float32, F.linear is MKL's sgemm, whose small-M path is slow: a 2-token verify costs
much more than a 1-token step, and no speculative method pays. oneDNN's prepacked float32
product brings the 2-token verify close to the step's cost (docs/results/draft-eval.md,
docs/results/design-figures.md). Its values are F.linear's to a few ulps (another summation
order), and a row's values do not depend on how many rows share the call, which sgemm's do not promise.

`LeanDraft` packs the distilled draft's matrices itself; this does the same for any Hugging
Face model's nn.Linear modules, so the target's verify forwards, Hugging Face `generate` and
harvest's forwards get it too.

A packed module stays the same object with the same parameters: state_dict keys, tied
weights, hooks, casts and moves are untouched. The packed copy is only read where no gradient
is needed (no grad mode, or neither input nor parameters require grad): anything that trains
goes through F.linear. It is rebuilt when the weight changed (version counter, storage, dtype
or device), as `LeanDraft` rebuilds its copies.

A compiled forward (`decoding.compile`) reaches the same packed copy through one custom op,
`sprinter_train::packed_linear`, which inductor calls as an opaque kernel (no graph break).
Inductor's own packing needs frozen weights and a static row dimension: with dynamo's automatic
dynamic shapes a verify block's (rows x width) is symbolic, so its 2- and 4-token forwards fall
back to sgemm's small-M path, slower than the op without freezing (docs/results/
design-figures.md, "Compiled forwards on a CPU").
The op finds the copy through the module that owns the weight (`_OWNERS`, by storage
address, checked against the module's current weight), so it never uses a stale copy: a weight
no packed module owns goes through F.linear.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from sprinter_train.models.weight_packing import pack, packs, project

# storage address of a packed module's weight -> that module (see `packed_linear`)
_OWNERS: dict[int, weakref.ref[PackedLinear]] = {}


@torch.library.custom_op("sprinter_train::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, weight, bias) on the packed copy of the `PackedLinear` that owns `weight`
    (compiled forwards call this; eager ones use the module's copy directly)."""
    ref = _OWNERS.get(weight.data_ptr())
    module = None if ref is None else ref()
    packed = module.packed_weight() if module is not None and module.owns(weight) else None
    return project(x, weight if packed is None else packed, bias)


@packed_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


class PackedLinear(nn.Linear):
    """An nn.Linear whose inference forwards use a prepacked copy of its weight.

    Made from a plain nn.Linear by `pack_linears` (in place: the module's class changes, its
    parameters do not). The copy is built on the first forward that can use it, so a model
    that only trains never holds one."""

    _packed: torch.Tensor | None
    _stamp: tuple[Any, ...] | None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if not self._packable(x):
            return F.linear(x, weight, bias)
        if torch.compiler.is_compiling():  # the copy's checks would break dynamo's graph
            return packed_linear(x, weight, bias)
        packed = self.packed_weight()
        return project(x, weight if packed is None else packed, bias)

    def packed_weight(self) -> torch.Tensor | None:
        """The packed copy of the current weight (rebuilt if the weight changed), or None
        where the weight does not pack or is an inference tensor (which keeps no version
        counter to notice changes)."""
        weight = self.weight
        if weight.is_inference():
            return None
        stamp = (weight._version, weight.data_ptr(), weight.dtype, weight.device)
        if stamp != self._stamp:
            with torch.no_grad():
                self._packed = pack(weight) if packs(weight) else None
            self._stamp = stamp
            self._register()
        return self._packed

    def owns(self, weight: torch.Tensor) -> bool:
        """Whether `weight` is this module's current weight (same storage, shape and dtype)."""
        mine = self.weight
        return (
            mine.data_ptr() == weight.data_ptr()
            and mine.shape == weight.shape
            and mine.dtype == weight.dtype
            and mine.device == weight.device
        )

    def _register(self) -> None:
        """Let `packed_linear` find this module by its weight's address (the entry leaves
        with the module)."""
        key = self.weight.data_ptr()

        def forget(ref: weakref.ref[PackedLinear]) -> None:
            if _OWNERS.get(key) is ref:
                del _OWNERS[key]

        _OWNERS[key] = weakref.ref(self, forget)

    def _packable(self, x: torch.Tensor) -> bool:
        """Whether this call may use the packed copy: no autograd graph would be recorded, no
        autocast would change the dtype, and the input has the weight's dtype (an inference
        tensor as weight is left to F.linear by `packed_weight`)."""
        weight, bias = self.weight, self.bias
        if torch.is_grad_enabled() and (
            x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
        ):
            return False
        return x.dtype == weight.dtype and not torch.is_autocast_enabled(x.device.type)

    def _apply(self, fn: Any, recurse: bool = True) -> PackedLinear:
        """A cast or move drops the packed copy (its memory) before it is stale."""
        self._packed, self._stamp = None, None
        module = super()._apply(fn, recurse)
        self._register()
        return module

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles leave the packed copy out: oneDNN's opaque tensors have no
        storage to copy; the copy repacks on its first forward."""
        state = super().__getstate__()
        return {**state, "_packed": None, "_stamp": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A copy registers its own weight, so its compiled forwards find its packed copy."""
        super().__setstate__(state)
        self._register()


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
            module._register()
            count += 1
    return count
