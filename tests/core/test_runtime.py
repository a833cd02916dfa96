"""dtype resolution: bfloat16 where the hardware runs it natively."""

from __future__ import annotations

from pathlib import Path

import torch

from sprinter_train.core import runtime


def test_native_bf16_is_read_from_cpu_flags(tmp_path: Path) -> None:
    with_bf16 = tmp_path / "a"
    with_bf16.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16\n")
    without = tmp_path / "b"
    without.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2\n")
    assert runtime.cpu_has_native_bf16(str(with_bf16))
    assert not runtime.cpu_has_native_bf16(str(without))
    assert not runtime.cpu_has_native_bf16(str(tmp_path / "missing"))


def test_auto_dtype_follows_the_cpu(monkeypatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: True)
    assert runtime.resolve_dtype("auto", cpu) == torch.bfloat16
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: False)
    assert runtime.resolve_dtype("auto", cpu) == torch.float32
    assert runtime.resolve_dtype("float32", cpu) == torch.float32
