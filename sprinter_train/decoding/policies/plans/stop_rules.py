"""When sd_learned stops drafting, chosen rather than assumed: three rule families over the
verifier's calibrated scores, and the round model that picks one per batch size.

After each draw the row's verifier score a_j of its j-th draft is known (the default
verifier reads the drafted token's own features, so a_j decides about x_{j+1} only, which
keeps the target's law: policies/base.py). A row then stops

- `goodput`: when one more draft, worth product * a_j more expected tokens, would not raise
  the round's estimated goodput (SV App. D; plans/goodput.py) at the engine's timings;
- `product`: when the product of its scores so far falls below `threshold`;
- `hazard`: when its latest score falls below `threshold`;

and `none` drafts nothing: a target-only round (gamma = 0), the rule at a batch size where no
drafting pays.

`choose` plays each candidate on records, as length_ceiling's round model does
(benchmarks/length_ceiling.py): a round may start at any position of a sequence of drafts
the draft drew from q, draws up to `gamma_max` of them as the rule says, and is worth
E(N) + 1 tokens, E(N) = sum_k prod_{i<=k} a_i with a_i = min(1, p/q) the i-th draft's
expected acceptance; it costs its drafting steps and the target's forward over its drafts + 1.
At batch size B, B round starts drawn at random share a round, which is as wide as its
longest row. The candidate of most modelled tokens a second is chosen; ties go to the
earlier candidate (`none` first, then `goodput`, the rule before any choice was made).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from sprinter_train.decoding.policies.plans.goodput import round_goodput

RULES = ("none", "goodput", "product", "hazard")
Seconds = Callable[[int, int], float]  # (rows, tokens a row) -> a target forward's seconds
StepCost = Callable[[int], float]  # rows -> seconds of one drafting step


@dataclass(frozen=True)
class StopRule:
    """A rule family and its threshold (None for `goodput` and `none`)."""

    rule: str = "goodput"
    threshold: float | None = None

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"a stop rule is one of {RULES}, not {self.rule!r}")
        if (self.threshold is None) != (self.rule in ("none", "goodput")):
            raise ValueError(
                f"stop rule {self.rule} takes a threshold only if it is product or hazard"
            )

    def describe(self) -> str:
        return self.rule if self.threshold is None else f"{self.rule} < {self.threshold:g}"

    def record(self) -> dict[str, object]:
        return {"rule": self.rule, "threshold": self.threshold}


class RoundStops:
    """One round's rule row by row, as a decoder applies it after each draw: the decoder's
    (LearnedLength.round) and vLLM's proposer (serving/vllm/proposer.py) share it, so both
    stop at the same draft for the same scores. `product` and `expected` are each row's
    product of scores and expected accepted drafts so far (numbers until the first draw)."""

    def __init__(self, rule: StopRule, rows: int, latency: Seconds, step_cost: StepCost) -> None:
        self.rule, self.rows, self.latency, self.step_cost = rule, rows, latency, step_cost
        self.product: torch.Tensor | float = 1.0
        self.expected: torch.Tensor | float = 0.0
        self.drafts = 0

    def rises(self, drafts: int, gain: torch.Tensor) -> torch.Tensor:
        """Whether one more draft after `drafts`, worth `gain` expected tokens, raises the
        round's goodput: round_goodput(expected + gain, drafts + 1) > round_goodput(expected,
        drafts), its seconds' ratio taken on the host (three ops on the device, not six)."""
        now = float(round_goodput(0.0, drafts, self.rows, self.latency, self.step_cost))
        more = float(round_goodput(0.0, drafts + 1, self.rows, self.latency, self.step_cost))
        return gain > (self.expected + 1.0) * (now / more - 1.0)

    def after(self, acceptance: torch.Tensor) -> torch.Tensor:
        """(rows,) bool: whether each row's latest draft, scored `acceptance`, is its last."""
        self.drafts += 1
        if self.rule.rule == "hazard":  # rows that stopped drafting are not read again
            return acceptance < float(self.rule.threshold)  # type: ignore[arg-type]
        self.product = self.product * acceptance
        if self.rule.rule == "product":
            return self.product < float(self.rule.threshold)  # type: ignore[arg-type]
        self.expected = self.expected + self.product
        return ~self.rises(self.drafts, self.product * acceptance)


@dataclass(frozen=True)
class Windows:
    """Every round start of a set of draft sequences: `accept` (n, G) the expected acceptance
    min(1, p/q) of the drafts from the start on, `score` (n, G) the verifier's scores of the
    same drafts, `valid` (n, G) whether the sequence still has a draft there."""

    accept: np.ndarray
    score: np.ndarray
    valid: np.ndarray

    @classmethod
    def of(cls, sequences: Sequence[tuple[np.ndarray, np.ndarray]], gamma_max: int) -> Windows:
        """From (accept, score) per sequence, in position order."""
        accepts, scores, valids = [], [], []
        for accept, score in sequences:
            n = len(accept)
            index = np.arange(n)[:, None] + np.arange(gamma_max)[None, :]
            valid = index < n
            index = np.minimum(index, max(n - 1, 0))
            accepts.append(np.where(valid, accept[index], 0.0))
            scores.append(np.where(valid, score[index], 0.0))
            valids.append(valid)
        if not accepts:
            empty = np.zeros((0, gamma_max))
            return cls(empty, empty, empty.astype(bool))
        return cls(np.concatenate(accepts), np.concatenate(scores), np.concatenate(valids))

    def __len__(self) -> int:
        return int(self.accept.shape[0])


def drafts_of(
    rule: StopRule, windows: Windows, rows: int, latency: Seconds, step_cost: StepCost
) -> np.ndarray:
    """(n,) how many drafts the rule draws from each round start: the decoder's rule
    (LearnedLength.round) played on the records, at batch size `rows`' prices."""
    n, gamma_max = windows.accept.shape
    drafts = np.zeros(n, dtype=np.int64)
    if rule.rule == "none" or gamma_max == 0:
        return drafts
    product, expected = np.ones(n), np.zeros(n)
    active = windows.valid[:, 0].copy()
    for j in range(gamma_max):
        a = windows.score[:, j]
        drafts += active
        product = product * a
        expected = expected + product
        if rule.rule == "goodput":
            now = (expected + 1.0) / round_seconds(j + 1, rows, latency, step_cost)
            more = (expected + product * a + 1.0) / round_seconds(j + 2, rows, latency, step_cost)
            stop = more <= now
        elif rule.rule == "product":
            stop = product < float(rule.threshold)  # type: ignore[arg-type]
        else:
            stop = a < float(rule.threshold)  # type: ignore[arg-type]
        nxt = windows.valid[:, j + 1] if j + 1 < gamma_max else np.zeros(n, dtype=bool)
        active = active & ~stop & nxt
    return drafts


def round_seconds(drafts: int, rows: int, latency: Seconds, step_cost: StepCost) -> float:
    """A round of `drafts` drafting steps and the target over drafts + 1 tokens a row."""
    return drafts * step_cost(rows) + latency(rows, drafts + 1)


def modelled_rate(
    drafts: np.ndarray,
    windows: Windows,
    rows: int,
    latency: Seconds,
    step_cost: StepCost,
    seed: int = 0,
) -> float:
    """Tokens a second of rounds of `rows` rows, each round `rows` random starts (seeded),
    as wide as its longest row: sum of E(N) + 1 over its rows, over its seconds."""
    n = len(windows)
    if n == 0:
        return 0.0
    taken = np.arange(windows.accept.shape[1])[None, :] < drafts[:, None]
    expected = (np.cumprod(np.where(taken, windows.accept, 0.0), axis=1) * taken).sum(1)
    order = np.random.default_rng(seed).permutation(n)
    groups = max(n // rows, 1)
    order = np.resize(order, groups * rows).reshape(groups, rows)
    tokens = (expected[order] + 1.0).sum()
    widths = drafts[order].max(1)
    seconds = sum(round_seconds(int(w), rows, latency, step_cost) for w in widths)
    return float(tokens / seconds)


@dataclass(frozen=True)
class Choice:
    """The rule chosen at a batch size, and every candidate's modelled tokens a second."""

    rule: StopRule
    rates: dict[str, float]  # candidate (`StopRule.describe`) -> tokens a second

    def record(self) -> dict[str, object]:
        return {
            **self.rule.record(),
            "modelled_tokens_per_s": self.rates[self.rule.describe()],
            "candidates": dict(self.rates),
        }


def candidates(product: Sequence[float], hazard: Sequence[float]) -> list[StopRule]:
    """`none`, `goodput`, then each threshold of the two threshold families."""
    return [
        StopRule("none"),
        StopRule("goodput"),
        *(StopRule("product", float(t)) for t in product),
        *(StopRule("hazard", float(t)) for t in hazard),
    ]


def choose(
    windows: Windows,
    rows: int,
    latency: Seconds,
    step_cost: StepCost,
    rules: Sequence[StopRule],
    seed: int = 0,
) -> Choice:
    """The candidate of most modelled tokens a second at batch size `rows` (see the module)."""
    rates = {
        rule.describe(): modelled_rate(
            drafts_of(rule, windows, rows, latency, step_cost),
            windows,
            rows,
            latency,
            step_cost,
            seed,
        )
        for rule in rules
    }
    best = max(range(len(rules)), key=lambda i: (rates[rules[i].describe()], -i))
    return Choice(rules[best], rates)


@dataclass
class StopRules:
    """The rule of each batch size (the bench's choice, or one rule for all): a batch of a
    size not chosen for takes the rule of the nearest size below it (else above).

    With the `windows` it was chosen on and its candidate `rules`, the choice is made again
    at the prices a round is planned with (`at`'s latency and step cost: the engine's
    timings, corrected by the run's own forwards) on a batch size's first round and every
    `every` rounds after: a latency profile that prices a forward below what the run's
    forwards take would otherwise keep a rule that does not pay (a compute-bound target
    forward costs more in a run than in its profile: docs/results/learned-end-to-end.md).
    The choice reads prices only, never a row's tokens: the law stays the target's."""

    by_batch: dict[int, StopRule]
    windows: Windows | None = None
    rules: tuple[StopRule, ...] = ()
    every: int = 16
    asked: dict[int, int] = field(default_factory=dict)  # rows -> rounds planned at that size
    # str(live rows) -> the rule a round ran by -> rounds: what the run did, the choice made
    # before it only where no re-choice changed it (results.json keeps this dict, live)
    rounds: dict[str, dict[str, int]] = field(default_factory=dict)

    def at(
        self, rows: int, latency: Seconds | None = None, step_cost: StepCost | None = None
    ) -> StopRule:
        if self.windows is not None and self.rules and latency is not None and step_cost:
            count = self.asked.get(rows, 0)
            self.asked[rows] = count + 1
            if count % self.every == 0:
                self.by_batch[rows] = choose(
                    self.windows, rows, latency, step_cost, self.rules
                ).rule
        if rows in self.by_batch:
            rule = self.by_batch[rows]
        else:
            below = [b for b in self.by_batch if b <= rows]
            rule = self.by_batch[max(below) if below else min(self.by_batch)]
        tally = self.rounds.setdefault(str(rows), {})
        tally[rule.describe()] = tally.get(rule.describe(), 0) + 1
        return rule
