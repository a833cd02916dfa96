"""Device, dtype and thread settings shared by every stage."""

from __future__ import annotations

import os

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(name: str = "auto") -> torch.device:
    """`auto` picks cuda, then mps, then cpu."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` is bfloat16 on accelerators and float32 on CPU (CPU half precision is slow)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[name]


def set_threads(num_threads: int | None) -> None:
    """Pin intra-op threads; 0 or None leaves torch's default."""
    if num_threads:
        torch.set_num_threads(int(num_threads))
        os.environ.setdefault("OMP_NUM_THREADS", str(num_threads))


def synchronize(device: torch.device) -> None:
    """Wall-clock timings on GPU need the queue drained first."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
