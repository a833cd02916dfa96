"""One round of each exported method at batch 1, as sprinter_train/decoding/policies.py plays
it for one row (the engine's batch reduces to these when it holds a single sequence).

Exactness (the lossless methods): every drawn draft is verified with speculative sampling, and
the decision to draw draft j uses only what is fixed before it is drawn (q_j, the companion's
c_j, a score of the hidden state that produced q_j) and the drafts before it; a score of x_j's
own value decides only whether x_{j+1} is drawn. SPRINTER is lossy by design (Theorem 3.1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .loop import Emitted, Pair
from .predictors import Latency, Table, Verifier, companion_features
from .sampling import entropy, inverse_cdf, residual


@dataclass
class Step:
    """One drafting step: the draft's distribution, the hidden state that produced it, its raw
    logits, and the token drawn (None: the rule stopped before drawing)."""

    q: torch.Tensor
    hidden: torch.Tensor
    logits: torch.Tensor
    token: int | None = None


Keep = Callable[[int, Step], bool]  # before the draw: draw draft j?
Stop = Callable[[Step], bool]  # after the draw: was this draft the last?


def draft_steps(
    pair: Pair, limit: int, stop: Stop | None = None, keep: Keep | None = None
) -> list[Step]:
    """Draw up to `limit` drafts; `keep` may end the run before a draw, `stop` after one."""
    steps: list[Step] = []
    drafts: list[int] = []
    for j in range(limit):
        out = pair.side_output(pair.draft, j, drafts)
        step = Step(pair.warp(out.logits[0]), out.hidden[0], out.logits[0])
        if keep is not None and not keep(j, step):
            break
        step.token = pair.sample(step.q)
        steps.append(step)
        drafts.append(step.token)
        if stop is not None and stop(step):
            break
    return steps


def verify(pair: Pair, steps: list[Step]) -> Emitted:
    """Speculative sampling: the accepted prefix, then a correction from norm(max(0, p - q))
    at the first rejection or a bonus token from p."""
    drafts = [int(s.token) for s in steps]  # type: ignore[arg-type]
    p = pair.warp(pair.target.feed(pair.sequence, drafts).logits)
    accepted = 0
    for j, (x, step) in enumerate(zip(drafts, steps, strict=True)):
        if not bool(pair.uniform() * step.q[x].double() < p[j, x].double()):
            break
        accepted = j + 1
    law = p[accepted]
    if accepted < len(drafts):
        law = residual(p[accepted], steps[accepted].q)
    token = pair.sample(law)
    return Emitted(drafts[:accepted] + [token], accepted, len(drafts), accepted)


@dataclass
class SprinterRule:
    """SPRINTER Alg. 2: draft while the verifier's score >= tau; the target checks only the
    token the verifier rejected (keep it with min(1, p/q), else draw from norm(max(0, p - q)));
    no bonus token. A run the verifier accepts up to `max_run` commits without the target."""

    verifier: Verifier
    tau: float
    max_run: int
    embedding: torch.nn.Module | None = None  # the draft's, for token features

    def __call__(self, pair: Pair) -> Emitted:
        limit = max(1, min(self.max_run, pair.remaining))
        rejected = False

        def stop(step: Step) -> bool:
            nonlocal rejected
            rows = self.verifier.features(step.hidden, step.q, step.token, self.embedding)
            rejected = bool(self.verifier.score(rows)[0] < self.tau)
            return rejected

        steps = draft_steps(pair, limit, stop)
        tokens = [int(s.token) for s in steps]  # type: ignore[arg-type]
        passed = False
        if rejected:
            p = pair.warp(pair.target.feed(pair.sequence, tokens).logits)[len(tokens) - 1]
            q, x = steps[-1].q, tokens[-1]
            u, u_fresh = pair.uniform(), pair.uniform()
            passed = bool(u * q[x].double() < p[x].double())
            if not passed:
                tokens[-1] = int(inverse_cdf(residual(p, q), u_fresh))
        kept = len(tokens) - int(rejected)
        return Emitted(tokens, kept, len(tokens), int(rejected and passed), kept)


@dataclass
class SVIPRule:
    """SVIP Alg. 1: draft until sqrt(c H_q) > h (the token that tripped it is kept); H of the
    draft's own softmax unless `warped_entropy`."""

    h: float
    c: float
    max_gamma: int
    warped_entropy: bool = False

    def __call__(self, pair: Pair) -> Emitted:
        def stop(step: Step) -> bool:
            H = entropy(step.q if self.warped_entropy else step.logits.float().softmax(-1))
            return bool(1.0 - (self.c * H.clamp(min=0.0)).sqrt() < 1.0 - self.h)

        return verify(pair, draft_steps(pair, pair.room(self.max_gamma), stop))


def goodput(expected: float, drafts: int, latency: Latency, companion: bool) -> float:
    """Estimated tokens a second of a round of `drafts` drafts expecting `expected` of them
    accepted, plus the target's own token (SV App. D); a step runs the companion too when the
    method reads one."""
    step = latency.step_s(companion)
    return (expected + 1.0) / (drafts * step + latency.target_s(drafts + 1))


@dataclass
class SVRule:
    """SV §5 exact, at batch 1: before drawing draft j, its gain is P(accept | S_j) times the
    product of the refined acceptances P(accept | S, A) of the drafts before it; draw while
    that raises the goodput. After each draw, x_j's refined acceptance stands in for the next
    draft's, and a run whose next draft would not pay at it stops before that draft's
    forwards. Every drawn draft is verified. A round whose average token (the table's prior)
    would not pay for one drafting step drafts nothing."""

    table: Table
    latency: Latency
    max_gamma: int

    def __call__(self, pair: Pair) -> Emitted:
        lat = self.latency
        if not goodput(self.table.prior, 1, lat, True) > goodput(0.0, 0, lat, True):
            return verify(pair, [])
        product, expected = 1.0, 0.0
        companion: list[torch.Tensor] = []
        drafts: list[int] = []

        def keep(j: int, step: Step) -> bool:
            c = pair.warp(pair.side_output(pair.companion, j, drafts).logits[0])
            companion.append(c)
            gain = product * self.table.lookup_s(torch.minimum(step.q, c).sum(-1))
            return self.pays(j, expected, gain)

        def stop(step: Step) -> bool:
            nonlocal product, expected
            drafts.append(int(step.token))  # type: ignore[arg-type]
            S, A = companion_features(step.q, companion[-1], drafts[-1])
            refined = self.table.lookup(S, A)
            product = product * refined
            expected = expected + product
            return not self.pays(len(drafts), expected, product * refined)

        return verify(pair, draft_steps(pair, pair.room(self.max_gamma), stop, keep))

    def pays(self, j: int, expected: float, gain: float) -> bool:
        """Whether draft j, worth `gain` expected tokens, raises the goodput (the engine's
        scheduler at batch 1, its order of sums kept)."""
        lat = self.latency
        base = expected + 1.0
        stop_time = j * lat.step_s(True) + lat.target_s(j + 1)
        go_time = (j + 1) * lat.step_s(True) + lat.target_s(j + 2)
        return (base + gain) / go_time > base / stop_time and gain > 0


@dataclass
class LearnedRule:
    """sd_learned: draw the next draft while it raises the estimated goodput, E(N | gamma)
    from the running product of the verifier's calibrated P(accept) (with a table, averaged
    with SV's P(accept | S) before the draw and P(accept | S, A) after it); every drawn draft
    is verified. A score known before x_j is drawn (a verifier of pre-draw features: hidden,
    draft_entropy; or the table's P(accept | S)) decides whether x_j is drawn; after each
    draw, x_j's acceptance stands in for the next draft's, and a run whose next draft would
    not pay at it stops before that draft's forward."""

    verifier: Verifier
    latency: Latency
    max_gamma: int
    table: Table | None = None
    embedding: torch.nn.Module | None = None

    def prior(self) -> float:
        """A draft's average acceptance before any forward: the mean of the table's and the
        verifier's priors where they have one, else 1."""
        priors = [] if self.table is None else [self.table.prior]
        if self.verifier.prior is not None:
            priors.append(self.verifier.prior)
        return sum(priors) / len(priors) if priors else 1.0

    def __call__(self, pair: Pair) -> Emitted:
        lat, read = self.latency, self.table is not None
        if not goodput(self.prior(), 1, lat, read) > goodput(0.0, 0, lat, read):
            return verify(pair, [])
        before_draw = self.verifier.before_the_draw
        informed = before_draw or self.table is not None  # a score known before the draw
        product, expected = 1.0, 0.0
        companion: list[torch.Tensor] = []
        drafts: list[int] = []
        scored: list[float] = []

        def rises(count: int, gain: float) -> bool:
            return goodput(expected + gain, count + 1, lat, read) > goodput(
                expected, count, lat, read
            )

        def score(step: Step) -> float:
            rows = self.verifier.features(step.hidden, step.q, step.token, self.embedding)
            return float(self.verifier.score(rows)[0])

        def keep(j: int, step: Step) -> bool:
            estimates = []
            if self.table is not None:
                c = pair.warp(pair.side_output(pair.companion, j, drafts).logits[0])
                companion.append(c)
                estimates.append(self.table.lookup_s(torch.minimum(step.q, c).sum(-1)))
            if before_draw:
                scored[:] = [score(step)]
                estimates.append(scored[0])
            return rises(j, product * mean(estimates))

        def stop(step: Step) -> bool:
            nonlocal product, expected
            drafts.append(int(step.token))  # type: ignore[arg-type]
            estimates = [scored[0] if before_draw else score(step)]
            if self.table is not None:
                S, A = companion_features(step.q, companion[-1], int(step.token))  # type: ignore[arg-type]
                estimates.append(self.table.lookup(S, A))
            acceptance = mean(estimates)
            product = product * acceptance
            expected = expected + product
            return not rises(len(drafts), product * acceptance)

        room = pair.room(self.max_gamma)
        return verify(pair, draft_steps(pair, room, stop, keep if informed else None))


def mean(values: list[float]) -> float:
    """The engine's torch mean of the estimates, in float64."""
    return float(torch.tensor(values, dtype=torch.float64).mean())
