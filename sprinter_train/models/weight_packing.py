"""The lean forward's matrices prepacked in oneDNN's blocked layout: whether a weight is
packed (`packs`), its packed copy (`pack`) and the product by it (`project`). Why the lean
forward packs: lean.py's docstring; `models.packed` packs the float32 linears of other
models with these."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def packs(weight: torch.Tensor) -> bool:
    """Whether `pack` prepacks this weight: float32 on a CPU with oneDNN (F.linear is MKL's
    sgemm there, several times slower at the engine's 2-8 rows: `models.packed`), and bf16 on
    a CPU whose oneDNN has native bf16 (there F.linear is a oneDNN product too, and the packed
    one gave its values bit for bit at every shape and batch tried); other dtypes and devices
    keep F.linear."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.float32:
        return True
    return weight.dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """A (out, in) weight as `project` multiplies by it: a prepacked oneDNN copy where `packs`
    says so, else the weight itself."""
    if packs(weight):
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach())
    return weight


def project(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """F.linear(x, weight, bias) for a weight from `pack`."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)
