"""Which stricter τ would hold a lossy method to the perplexity bar (`bench.guard.tau_ladder`).

A lossy method past `bench.guard.ppl_ratio` that has a threshold τ is decoded again on the
batch-1 run's prompts, one prompt at a time with the same seeds, at each value of the ladder
stricter than its own τ, nearest first, until one holds the bar; the target's perplexity of
those outputs over target_only's is the verdict, as for the timed run. Stricter is higher for
every thresholded rule here: sprinter drafts on while the verifier's score is >= τ and mtad
keeps the prefix whose joint ratio is > τ, so a higher τ lets fewer drafts through unchecked.

Off the timed path and bounded: it runs after every timed run, only for the methods that broke
the bar, and at most one pass over the prompts per ladder value. results.json's
`quality_guard.tau_ladder` holds each such method's tries and the τ that holds it (None: no
value of the ladder does, or the method has no τ to tighten).

A policy at another threshold (`at_threshold`) and its untimed pass over the prompts scored by
the target (`decode_untimed`) are shared with the lossy frontier (bench/quality/frontier.py),
which decodes each lossy rule over its own ladder the same way.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from sprinter_train.bench.quality.scores import scored_mean, target_perplexities
from sprinter_train.decoding.batch import Policy
from sprinter_train.decoding.engine import Engine

log = logging.getLogger(__name__)

TAU = "tau"  # the policy field the ladder sets
STRICTER = "higher"  # the direction that accepts fewer drafts unchecked (see the module's text)


def method_tau(policy: Policy) -> float | None:
    """The policy's τ, None when it has none to tighten."""
    if not dataclasses.is_dataclass(policy):
        return None
    if TAU not in {field.name for field in dataclasses.fields(policy)}:
        return None
    value = getattr(policy, TAU)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def stricter_taus(tau: float, ladder: Iterable[float]) -> list[float]:
    """The ladder's values stricter than `tau`, nearest first."""
    return sorted({float(value) for value in ladder if float(value) > tau})


def at_threshold(policy: Policy, field: str, value: float) -> Policy:
    """The policy with its threshold `field` at `value`; a verifier that learns while decoding
    (`observe`) is copied as it stands, so each value starts from the state the timed runs left
    and none feeds the next."""
    changes: dict[str, Any] = {field: value}
    verifier = getattr(policy, "verifier", None)
    if verifier is not None and hasattr(verifier, "observe"):
        changes["verifier"] = copy.deepcopy(verifier)
    return dataclasses.replace(policy, **changes)  # type: ignore[type-var]


def at_tau(policy: Policy, tau: float) -> Policy:
    """The policy at `tau` (`at_threshold` of its τ)."""
    return at_threshold(policy, TAU, tau)


@dataclass
class Untimed:
    """One untimed pass of a policy over the prompts: its outputs, the target's perplexity of
    them (`scored_mean`: NaN when nothing was scored) and the pass's tokens and wall seconds
    (no warm-up: a rough speed, never a timed figure)."""

    outputs: list[list[int]]
    target_ppl: float
    tokens: int
    wall_s: float


def decode_untimed(
    policy: Policy,
    engine: Engine,
    target: nn.Module,
    prompts: Sequence[Sequence[int]],
    seeds: Sequence[int],
    max_new_tokens: int,
    nll_batch_size: int,
    batch_size: int = 1,
) -> Untimed:
    """The prompts decoded with `policy` in consecutive groups of `batch_size` (prompt i with
    seeds[i]), and the target's perplexity of the outputs."""
    outputs: list[list[int]] = []
    wall = 0.0
    step = max(1, int(batch_size))
    for start in range(0, len(prompts), step):
        group = [list(ids) for ids in prompts[start : start + step]]
        results = engine.generate(group, policy, max_new_tokens, seeds[start : start + step])
        outputs += [r.tokens for r in results]
        wall += results[0].wall_s
    pairs = list(zip(prompts, outputs, strict=True))
    ppl = scored_mean(target_perplexities(target, pairs, nll_batch_size))
    return Untimed(outputs, ppl, sum(len(o) for o in outputs), wall)


def climb(
    policy: Policy,
    engine: Engine,
    target: nn.Module,
    prompts: Sequence[Sequence[int]],
    seeds: Sequence[int],
    max_new_tokens: int,
    base_ppl: float,
    bar: float,
    ladder: Iterable[float],
    nll_batch_size: int,
) -> dict[str, Any]:
    """One method up the ladder: each stricter τ's target perplexity over `base_ppl` until one
    is within `bar`; `holds` is that τ (None when none is)."""
    tau = method_tau(policy)
    entry: dict[str, Any] = {"tau": tau, "stricter": STRICTER, "tried": [], "holds": None}
    if tau is None:
        return entry
    for value in stricter_taus(tau, ladder):
        strict = at_tau(policy, value)
        ppl = decode_untimed(
            strict, engine, target, prompts, seeds, max_new_tokens, nll_batch_size
        ).target_ppl
        ratio = ppl / base_ppl if ppl == ppl else None
        met = ratio is not None and ratio <= bar
        entry["tried"].append({"tau": value, "target_ppl": ppl, "ratio": ratio, "met": met})
        log.info("bench: %s at tau %g: target perplexity %.3f", policy.name, value, ppl)
        if met:
            entry["holds"] = value
            break
    return entry


def hold_taus(
    results: dict[str, Any],
    policies: Mapping[str, Policy],
    engine: Engine,
    target: nn.Module,
    prompts: Sequence[Sequence[int]],
    seeds: Sequence[int],
    max_new_tokens: int,
    ladder: Iterable[float],
    nll_batch_size: int,
) -> dict[str, Any]:
    """`quality_guard.tau_ladder`: `climb` for each engine method that broke the bar."""
    guard = results.get("quality_guard")
    if not guard:
        return {}
    ladder = [float(value) for value in ladder]
    found = {
        name: climb(
            policies[name],
            engine,
            target,
            prompts,
            seeds,
            max_new_tokens,
            guard["target_only_ppl"],
            guard["bar"],
            ladder,
            nll_batch_size,
        )
        for name in guard.get("broken") or []
        if name in policies
    }
    guard["ladder"] = ladder
    guard["tau_ladder"] = found
    return found
