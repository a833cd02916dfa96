"""How many tokens a second a round is expected to give: the goodput model every length
planner shares (sv's scheduler, sd's gamma planner, sd_learned, sv's prior rounds).

SV App. D: a round that drafts gamma tokens a row with acceptances a_1..a_gamma is expected to
keep E(N | gamma) = sum_k prod_{i<=k} a_i of them, and costs gamma drafting steps plus the
target's forward over gamma + 1 tokens a row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sprinter_train.decoding.timings import Seconds, StepCost


def expected_accepted(acceptance: torch.Tensor) -> torch.Tensor:
    """E(N | gamma) for gamma = 1..G from (..., G) acceptances a_i: sum_{k<=gamma} prod_{i<=k}
    a_i (SV App. D, eq. 3-4, with a_i the predicted acceptance of the i-th draft)."""
    return acceptance.cumprod(-1).cumsum(-1)


def round_goodput(
    expected: torch.Tensor | float,
    drafts: int,
    batch_size: int,
    latency: Seconds,
    step_cost: StepCost,
) -> torch.Tensor | float:
    """Estimated tokens a second of a round that drafts `drafts` tokens a row and expects
    `expected` of them accepted: those and the target's own token, over the drafting steps and
    the target's forward over drafts + 1 tokens a row (SV App. D's goodput; counting the
    target's token makes a round without drafts worth its one token, not nothing)."""
    seconds = drafts * step_cost(batch_size) + latency(batch_size, drafts + 1)
    return (expected + 1.0) / seconds


@dataclass
class AcceptanceRate:
    """The per-draft acceptance alpha, pooled over every row and round so far.

    A round that kept a of d drafts checked a + 1 of them when a < d and d when a = d (drafts
    after a rejection are never judged), so alpha = kept / checked is the geometric model's
    estimate; dividing by the drafted count instead would call the unjudged drafts rejected.
    The prior (the bench's alpha) counts as `weight` checks; without one, alpha is unknown
    until a draft was checked.

    Pooled, not per row: sd drafts one gamma for the whole batch (the target verifies a block
    as wide as the longest row's drafts and the draft steps while any row drafts, so a row
    drafting fewer saves nothing), so a round's expected tokens are the sum of its rows'
    E(N | gamma); per-row estimates from a few rounds of at most gamma checks are noisy, and
    E(N | gamma) = alpha + ... + alpha^gamma is convex in alpha, so a sum over noisy rows
    overstates what long rounds gain, and a new row would have no estimate at all.
    """

    prior: float | None
    weight: float  # how many judged drafts the prior counts as
    kept: int = 0
    checked: int = 0

    def observe(self, drafted: int, accepted: int) -> None:
        """One row's round: `drafted` drafts, of which the target kept the first `accepted`."""
        self.kept += accepted
        self.checked += accepted + int(accepted < drafted)

    @property
    def value(self) -> float | None:
        if self.prior is None:
            return self.kept / self.checked if self.checked else None
        return (self.prior * self.weight + self.kept) / (self.weight + self.checked)


def goodputs(
    alpha: float, rows: int, gamma_max: int, latency: Seconds, step_cost: StepCost
) -> list[float]:
    """Estimated tokens a second of a round of gamma = 0..gamma_max drafts a row at acceptance
    alpha: sv's `round_goodput` with E(N | gamma) = alpha + alpha^2 + ... + alpha^gamma."""
    per_draft = torch.full((gamma_max,), float(alpha), dtype=torch.float64)
    expected = [0.0, *expected_accepted(per_draft).tolist()]
    return [float(round_goodput(e, g, rows, latency, step_cost)) for g, e in enumerate(expected)]


def best_gamma(
    alpha: float, rows: int, gamma_max: int, latency: Seconds, step_cost: StepCost
) -> int:
    """The gamma of highest estimated goodput."""
    return highest(goodputs(alpha, rows, gamma_max, latency, step_cost))


def highest(values: list[float]) -> int:
    """The index of the highest value, the smallest of equals (fewer drafts for the same)."""
    return max(range(len(values)), key=lambda g: (values[g], -g))
