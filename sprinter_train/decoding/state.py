"""Per-sequence decoding state: tokens, caches, random stream, counters, policy memory.

Everything that differs between two sequences lives here, so one engine and one policy can
serve a batch of states (the batching issue) without a rewrite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from sprinter_train.decoding.runner import CacheSlot


@dataclass
class DecodeStats:
    """What the bench reports per method; times are wall seconds inside model calls."""

    target_calls: int = 0
    draft_calls: int = 0
    companion_calls: int = 0
    verifier_calls: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0  # drafted tokens the target's check kept
    verifier_accepted: int = 0  # drafted tokens committed on a verifier's word, never checked
    target_seconds: float = 0.0
    draft_seconds: float = 0.0
    companion_seconds: float = 0.0
    verifier_seconds: float = 0.0

    def add(self, other: DecodeStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class SequenceState:
    tokens: list[int]
    prompt_len: int
    max_new_tokens: int
    generator: torch.Generator
    eos_token_id: int | None = None
    slots: dict[str, CacheSlot] = field(default_factory=dict)
    stats: DecodeStats = field(default_factory=DecodeStats)
    memory: dict[str, Any] = field(default_factory=dict)  # a policy's per-sequence state
    finished: bool = False

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.generated)

    def slot(self, role: str) -> CacheSlot:
        if role not in self.slots:
            self.slots[role] = CacheSlot()
        return self.slots[role]
