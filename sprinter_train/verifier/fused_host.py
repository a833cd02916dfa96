"""The CPU path of the fused verifier score (verifier/fused.py): each scalar feature written
into one preallocated row by a recipe that gives exactly its feature's value (up to float32
rounding where the docstring of fused.py says), and the check that a row-state part cached
over a round is still the state's. Kept apart from fused.py so each module holds one job."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from sprinter_train.verifier.fused import FusedLinearScore

HIDDEN = "hidden"
LOWEST = torch.finfo(torch.float32).min


def version_of(tensor: torch.Tensor) -> int | None:
    """The tensor's count of in-place writes; None for an inference tensor, which keeps none
    (the engine writes no RowState field in place: `RowState.after` makes new tensors)."""
    return None if tensor.is_inference() else tensor._version


def unchanged(
    kept: tuple[tuple[str, torch.Tensor, int | None], ...], rows: dict[str, torch.Tensor]
) -> bool:
    """Whether each kept (field, tensor, version) is still the field's tensor, unwritten."""
    for field, tensor, version in kept:
        now = rows.get(field)
        if now is not tensor or (version is not None and now._version != version):
            return False
    return True


class HostStep(NamedTuple):
    """What a host recipe reads of a step (`_host_score`'s arguments)."""

    q: torch.Tensor  # (B, K) or (B, 1, K) float32
    logits: torch.Tensor  # as q
    index: torch.Tensor  # (B,) the drawn token's index into q
    run: torch.Tensor | None  # (B,) the run, without the round's `offset`-th step
    offset: int
    bounds: dict[str, torch.Tensor]


def _write_q(step: HostStep, out: torch.Tensor) -> None:
    """q(x) (the `q` feature, `_drafted_q`)."""
    torch.gather(step.q, -1, step.index.view(step.q.shape[:-1] + (1,)), out=out)


def _write_entropy(step: HostStep, out: torch.Tensor) -> None:
    """H(q) (`draft_entropy`: core/distributions.py's `entropy`, q mostly 0 after the warp)."""
    torch.sum(torch.special.entr(step.q), -1, keepdim=True, out=out)


def _write_margin(step: HostStep, out: torch.Tensor) -> None:
    """The raw logits' top-1 minus top-2 (`draft_margin`, `top2_margin`), exactly: the max
    less the max of the rest, the first max's own entry set to -inf (a tie at the top leaves
    its twin: margin 0, as topk's). A max and an amax over K values cost half a topk."""
    top = step.logits.max(-1, keepdim=True)
    rest = step.logits.scatter(-1, top.indices, float("-inf")).amax(-1, keepdim=True)
    torch.sub(top.values, rest, out=out)


def _write_raw_entropy(step: HostStep, out: torch.Tensor) -> None:
    """sum(p * log p) of p = softmax(logits): `draft_entropy_raw`'s value negated, up to
    rounding. log p is one log_softmax (vectorised, a row at a time), where `entr` takes a
    scalar log of each p in turn; a -inf logit (p = 0) counts 0, as 0 log 0 does. p is its
    own softmax, not exp(log p): an exp of K values runs on several threads (a grain of
    2048), a row's softmax on one."""
    log_p = torch.log_softmax(step.logits, -1).clamp_min_(LOWEST)
    p = torch.softmax(step.logits, -1)
    torch.sum(p.mul_(log_p), -1, keepdim=True, out=out)


def _write_run(step: HostStep, out: torch.Tensor) -> None:
    """The run position clipped to [0, cap] (`run_position`: `clipped_run`)."""
    assert step.run is not None, "run_position needs the batch's state"
    run = step.run if step.offset == 0 else step.run + step.offset
    torch.clamp(run, step.bounds["0"], step.bounds["cap"], out=out)


@dataclass(frozen=True)
class HostScalar:
    """How the host path writes a scalar feature's column, and the sign its weight takes."""

    write: Callable[[HostStep, torch.Tensor], None]
    sign: float = 1.0
    flat: bool = False  # its column as (B,), else (B, 1)


HOST_SCALARS = {
    "q": HostScalar(_write_q),
    "draft_entropy": HostScalar(_write_entropy),
    "draft_margin": HostScalar(_write_margin),
    "draft_entropy_raw": HostScalar(_write_raw_entropy, -1.0),
    "run_position": HostScalar(_write_run, flat=True),
}


@dataclass(frozen=True)
class HostRows:
    """The host path's buffers for B rows: `x` (B, columns) holds the step's parts, each
    written in place by its own op (the embedding table's value, the float16-rounded hidden
    state, the scalars), for one product with the weights. Plain tensors (not inference
    ones), so a caller in either mode may write them; every column is written every call,
    one call at a time (the engine's draft steps follow each other)."""

    x: torch.Tensor  # (B, columns)
    half: torch.Tensor  # the hidden state (its shape) in float16, as records store it
    table: torch.Tensor | None  # (B,) view of x
    hidden: torch.Tensor | None  # view of x, the hidden state's shape
    columns: tuple[tuple[Callable[[HostStep, torch.Tensor], None], torch.Tensor], ...]

    @staticmethod
    def build(scorer: FusedLinearScore, hidden: torch.Tensor) -> HostRows:
        """The buffers for a step's hidden state of this shape, (B, d) or (B, 1, d): its
        columns are views of x in its leading shape (a scalar's (B, 1) or (B, 1, 1), a flat
        one's (B,)), so each op writes its own result in place."""
        lead, d = tuple(hidden.shape[:-1]), int(hidden.shape[-1])
        d = d if HIDDEN in scorer.dense else 0
        width = int(scorer._table is not None) + d + len(scorer.step_scalars)
        device = hidden.device
        with torch.inference_mode(False):
            x = torch.zeros((lead[0], width), device=device)
            shaped = x.view(*lead, width)
            half = torch.zeros((*lead, d), dtype=torch.float16, device=device)
            at = 0
            table = None
            if scorer._table is not None:
                table, at = x[:, 0], 1
            block = None
            if d:
                block, at = shaped[..., at : at + d], at + d
            columns = []
            for name in scorer.step_scalars:
                recipe = HOST_SCALARS[name]
                columns.append(
                    (recipe.write, x[:, at] if recipe.flat else shaped[..., at : at + 1])
                )
                at += 1
        return HostRows(x, half, table, block, tuple(columns))
