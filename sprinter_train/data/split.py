"""Deterministic train/val/test assignment by prompt id (never by row or by order)."""

from __future__ import annotations

import hashlib

SPLITS = ("train", "val", "test")


def split_of(
    prompt_id: str, seed: int = 0, val_fraction: float = 0.1, test_fraction: float = 0.1
) -> str:
    """Hash the id with the seed into [0, 1); the same id lands in the same split on every machine."""
    if not (val_fraction >= 0 and test_fraction >= 0 and val_fraction + test_fraction < 1):
        raise ValueError("val_fraction + test_fraction must lie in [0, 1)")
    digest = hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < test_fraction:
        return "test"
    if u < test_fraction + val_fraction:
        return "val"
    return "train"


def split_settings(data_cfg) -> dict[str, float]:
    """The arguments of `split_of` from a data config, so every stage splits the same way."""
    return {
        "seed": int(data_cfg.get("seed", 0)),
        "val_fraction": float(data_cfg.get("val_fraction", 0.1)),
        "test_fraction": float(data_cfg.get("test_fraction", 0.1)),
    }
