"""Device, dtype and thread settings shared by every stage."""

from __future__ import annotations

from typing import Any

import torch

from sprinter_train.core.machine import fit_threads
from sprinter_train.core.schema import Switch

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


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """AVX512-BF16 or AMX-BF16 in the CPU flags: bfloat16 matmuls run natively (oneDNN)."""
    try:
        with open(cpuinfo) as handle:
            flags = next((line for line in handle if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` is bfloat16 on accelerators and on CPUs with native bfloat16, else float32.

    Why: on a CPU with native bfloat16 a decode step is faster in bfloat16, and a forward over
    a few new tokens costs about what one over a single token does, which speculative decoding
    needs to pay; in float32 it does not (docs/results/design-figures.md, "The dtype on a
    CPU").
    """
    if name == "auto":
        if device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16()):
            return torch.bfloat16
        return torch.float32
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[name]


AUTO_SWITCH = Switch(words=("auto",))  # decoding.compile's values: auto, true or false


def parse_switch(value: Any) -> str | bool | None:
    """ "auto", True or False from a config value (any form of true or false the settings
    take: `yes`, `off`, `1`, ...); None if it is none of them. `decoding.compile` and
    `decoding.static_cache` take these values."""
    try:
        return AUTO_SWITCH.read(value)
    except ValueError:
        return None


def resolve_compile(setting: str | bool, device: torch.device) -> bool:
    """`decoding.compile`: `auto` compiles on CUDA only, where a decode step is launch-bound;
    on a CPU the compile time buys too little speed (docs/results/design-figures.md, "Compile
    on CUDA, not on a CPU")."""
    switch = parse_switch(setting)
    if switch is None:
        raise ValueError(f"decoding.compile={setting!r}: choose auto, true or false")
    if switch == "auto":
        return device.type == "cuda"
    return bool(switch)


def set_threads(num_threads: int | None) -> int:
    """Pin intra-op threads: `num_threads`, or for 0 / None as many as the machine has free
    cores (core/machine.py says why). Returns the count."""
    return fit_threads(num_threads)


def synchronize(device: torch.device) -> None:
    """Wall-clock timings on GPU need the queue drained first."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
