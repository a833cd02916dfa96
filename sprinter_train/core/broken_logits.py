"""Non-finite logits stop the run, naming the model and the position.

Unchecked, a model that outputs NaN or +inf (a broken checkpoint, an fp16 overflow) decodes
garbage silently: greedy's argmax emits token 0 every time, sampling dies in an IndexError
far away. -inf alone is legitimate (a restricted head gives q = 0 outside its token set),
so a distribution is broken when its largest logit is not finite: NaN and +inf propagate to
the max, and an all--inf row has no token to emit.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class NonFiniteLogitsError(FloatingPointError):
    """A model's logits hold NaN or +inf, or no finite value, at some position."""


def broken_rows(logits: torch.Tensor) -> torch.Tensor:
    """(...,) True where the (..., V) logits hold NaN or +inf or no finite value (no sync)."""
    return ~torch.isfinite(logits.amax(-1))


def nonfinite_error(role: str, where: str) -> NonFiniteLogitsError:
    return NonFiniteLogitsError(
        f"the {role} model's logits are NaN or infinite {where}: its weights or the dtype "
        "(float16 overflow?) are broken; nothing was written for this batch. Try dtype=float32 "
        "or check the model files."
    )


def check_logits(logits: torch.Tensor, role: str, where: Callable[[int], str]) -> None:
    """Raise naming `role` and `where(i)` for the first broken row i of the (N, V) logits.
    One host read: call it once per batch, not once per decoding step."""
    bad = broken_rows(logits)
    if bool(bad.any()):
        raise nonfinite_error(role, where(int(bad.nonzero()[0, 0])))
