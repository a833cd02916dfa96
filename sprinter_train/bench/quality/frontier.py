"""The lossy frontier (`bench.frontier`): for each lossy rule at each of its thresholds, tokens/s
against the target's perplexity of its output over target_only's, so SPRINTER's trained
verifier is set against simple lossy rules at equal loss of quality.

The rules (`RULES`, results.json's `rule`):

- `verifier`: sprinter with the verifier the bench loaded for it (its trained one,
  `methods.sprinter.verifier`), over τ;
- `entropy`: sprinter's decoder with a hand verifier, exp(−H) of the draft's raw softmax
  (decoding/policies/entropy_verifier.py), over τ;
- `typical`: Medusa's typical acceptance (decoding/policies/typical.py), over ε.

Stricter is higher for all three: sprinter commits a draft unchecked while its score is >= τ,
and typical acceptance's threshold min(ε, δ exp(−H)) grows with ε (δ = sqrt(ε) by default).
The frontier builds the three itself whenever it runs (`enabled: auto`: whenever a lossy
method is benched), listed in `bench.methods` or not; the `verifier` rule needs sprinter's
verifier, so it has points only when sprinter was benched with a trained one.

At each batch size of `bench.frontier.batches` (of those the run decoded) the batch-1 run's
prompts and seeds are decoded untimed at every threshold, in consecutive groups of that size
(tau_ladder.py's `decode_untimed`, as the τ ladder decodes), and the target's perplexity of
the outputs over target_only's (the timed batch-1 run's; an untimed target_only pass where
target_only was not benched) is the point's `ppl_ratio`. Then the points on the frontier by
the untimed pass's speed (`pareto`: no other point, of any rule, at least as fast with at most
its ratio, and better in one), and each rule's fastest point within `bench.guard.ppl_ratio`,
are timed as the bench times its methods (bench/run/runs.py's `run_methods`, with the bench's
own `warmup_runs` and `min_timed_runs`, the points interleaved per group). The untimed speed
only chooses what to time (one pass after a one-group warm-up): it is kept in
`frontier_summary.untimed_tokens_per_s`, never reported as tokens/s, and a point not timed has
`tokens_per_s` null.

results.json: `frontier`, one entry per point with exactly `KEYS`; `frontier_summary`: the
settings, the base perplexity, why a rule has no points, the untimed speeds (in the order of
`frontier`) and, per batch size, each rule's fastest timed point within the bar and the
verifier's tokens/s over the best hand rule's (`verdict`), held to
`bench.frontier.verifier_vs_hand`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hydra.utils import instantiate
from omegaconf import DictConfig

from sprinter_train.bench.quality.guard import settings_of
from sprinter_train.bench.quality.tau_ladder import at_threshold, decode_untimed
from sprinter_train.bench.run.methods import at_batch_size, is_entropy
from sprinter_train.bench.run.runs import engine_decode, run_methods
from sprinter_train.core.config import conf_defaults
from sprinter_train.core.schema import Switch
from sprinter_train.decoding.batch import Policy
from sprinter_train.decoding.policies.entropy_verifier import EntropyVerifier
from sprinter_train.decoding.policies.registry import traits_of
from sprinter_train.decoding.policies.speculative import TargetOnly
from sprinter_train.decoding.policies.sprinter import Sprinter

if TYPE_CHECKING:
    from sprinter_train.bench.run.prepare import Setup

log = logging.getLogger(__name__)

RULES = ("verifier", "entropy", "typical")
HAND = ("entropy", "typical")  # the hand rules the trained verifier is set against
FIELD = {"verifier": "tau", "entropy": "tau", "typical": "epsilon"}  # the threshold a ladder sets
METHOD = {"verifier": "sprinter", "entropy": "sprinter", "typical": "typical"}  # whose decoder
SYMBOL = {"verifier": "τ", "entropy": "τ", "typical": "ε"}  # as results.md writes the threshold
KEYS = ("method", "rule", "threshold", "batch", "tokens_per_s", "ppl_ratio")  # one entry's keys
ENABLED = Switch(words=("auto",))


def settings(node: Mapping[str, Any] | None) -> dict[str, Any]:
    """`bench.frontier` (conf/bench/default.yaml's where a key is missing)."""
    given = {**conf_defaults("bench/default.yaml", "frontier"), **(node or {})}
    return {
        "enabled": ENABLED.read(given["enabled"]),
        "batches": [int(b) for b in given["batches"]],
        "verifier_vs_hand": float(given["verifier_vs_hand"]),
        **{rule: [float(v) for v in given[rule] or []] for rule in RULES},
    }


def wanted(cfg: DictConfig, setup: Setup) -> bool:
    """Whether the frontier runs: `enabled` true, or auto and a lossy method was benched."""
    enabled = settings(cfg.bench.get("frontier")).get("enabled")
    if enabled == "auto":
        return any(not traits_of(cfg.methods[n], n).lossless for n in setup.plan.policies)
    return bool(enabled)


# -- the pure part: which points are on the frontier, the fastest within the bar ---------------


def valid(speed: float | None, ratio: float | None) -> bool:
    return speed is not None and ratio is not None and speed == speed and ratio == ratio


def pareto(points: Sequence[tuple[float | None, float | None]]) -> list[bool]:
    """Per (tokens/s, ppl ratio) point, whether it is on the frontier: no other point is at
    least as fast with at most its ratio and strictly better in one. A point missing either
    figure is not on it (and beats none)."""
    kept = {i: (float(s), float(r)) for i, (s, r) in enumerate(points) if valid(s, r)}

    def beaten(a: tuple[float, float]) -> bool:
        return any(
            b[0] >= a[0] and b[1] <= a[1] and (b[0] > a[0] or b[1] < a[1]) for b in kept.values()
        )

    return [i in kept and not beaten(kept[i]) for i in range(len(points))]


def fastest_within(points: Sequence[tuple[float | None, float | None]], bar: float) -> int | None:
    """The index of the fastest point whose ratio is within `bar` (None: none is)."""
    held = {i: float(s) for i, (s, r) in enumerate(points) if valid(s, r) and float(r) <= bar}
    return max(held, key=held.__getitem__) if held else None


def on_frontier(entries: Sequence[Mapping[str, Any]]) -> list[bool]:
    """`pareto` of the timed entries of one batch size (an untimed one is off it)."""
    return pareto([(e["tokens_per_s"], e["ppl_ratio"]) for e in entries])


def verdict(entries: Sequence[Mapping[str, Any]], bar: float, least: float) -> dict[str, Any]:
    """One batch size's reading: each rule's fastest timed entry within `bar` (None: no timed
    point of it holds the bar), the fastest hand rule's, and the verifier's tokens/s over it,
    held to `least` (`met` None when either side has no point within the bar)."""
    fastest: dict[str, Any] = {}
    for rule in RULES:
        own = [e for e in entries if e["rule"] == rule]
        index = fastest_within([(e["tokens_per_s"], e["ppl_ratio"]) for e in own], bar)
        fastest[rule] = None if index is None else dict(own[index])
    hand = [r for r in HAND if fastest[r] is not None]
    best = max(hand, key=lambda r: fastest[r]["tokens_per_s"]) if hand else None
    ratio = None
    if best is not None and fastest["verifier"] is not None:
        ratio = fastest["verifier"]["tokens_per_s"] / fastest[best]["tokens_per_s"]
    return {
        "bar": bar,
        "fastest": fastest,
        "best_hand": best,
        "verifier_vs_hand": ratio,
        "least": least,
        "met": None if ratio is None else ratio >= least,
    }


# -- the decoding: each rule over its ladder, untimed, then the chosen points timed -------------


@dataclass
class Point:
    """One rule at one threshold and batch size: its perplexity ratio, the untimed pass's speed
    and, once timed, its tokens/s."""

    rule: str
    threshold: float
    batch: int
    ppl_ratio: float | None
    untimed_tokens_per_s: float | None
    tokens_per_s: float | None = None

    @property
    def name(self) -> str:
        return f"{self.rule}@{self.threshold:g}"

    def entry(self) -> dict[str, Any]:
        values = (
            METHOD[self.rule],
            self.rule,
            self.threshold,
            self.batch,
            self.tokens_per_s,
            self.ppl_ratio,
        )
        return dict(zip(KEYS, values, strict=True))


def rule_policies(
    cfg: DictConfig, setup: Setup, size: int
) -> tuple[dict[str, Policy], dict[str, str]]:
    """Each rule's policy at batch `size` (at its own threshold: the ladder sets the rest), and
    why a rule has none."""
    plan = at_batch_size(setup.plan, cfg, setup.gammas[size])
    found: dict[str, Policy] = {}
    absent: dict[str, str] = {}
    sprinter = plan.policies.get("sprinter")
    if sprinter is None:
        absent["verifier"] = setup.plan.skipped.get("sprinter") or (
            "sprinter is not in bench.methods: no trained verifier was loaded"
        )
    elif is_entropy(cfg.methods.sprinter.verifier):
        absent["verifier"] = (
            "sprinter's verifier is the entropy rule here (methods.sprinter.verifier.kind="
            "entropy), not a trained one"
        )
    else:
        found["verifier"] = sprinter
    node = cfg.methods.get("sprinter")
    if node is None:
        absent["entropy"] = "no methods.sprinter (conf/methods/sprinter.yaml) to take max_run from"
    else:
        found["entropy"] = Sprinter(EntropyVerifier(), float(node.tau), int(node.max_run))
    typical = plan.policies.get("typical")
    if typical is None and "typical" in cfg.methods:
        node = cfg.methods.typical
        gamma = setup.gammas[size] if node.get("gamma") == "auto" else int(node.gamma)
        typical = instantiate(node, gamma=gamma)
    if typical is None:
        absent["typical"] = "no methods.typical (conf/methods/typical.yaml)"
    else:
        found["typical"] = typical
    return found, absent


def base_perplexity(
    cfg: DictConfig, setup: Setup, results: Mapping[str, Any]
) -> tuple[float | None, str]:
    """target_only's target perplexity on the batch-1 prompts and where it came from: the
    timed batch-1 run's, else an untimed target_only pass."""
    base = (results.get("quality_guard") or {}).get("target_only_ppl")
    if base is not None and base == base and base > 0:
        return float(base), "target_only's timed batch-1 run"
    b = cfg.bench
    untimed = decode_untimed(
        TargetOnly(),
        setup.engine,
        setup.models.target.model,
        [p.input_ids for p in setup.prompts],
        [int(b.seed) + i for i in range(len(setup.prompts))],
        int(b.max_new_tokens),
        int(b.guard.nll_batch_size),
    )
    ppl = untimed.target_ppl
    return (ppl if ppl == ppl and ppl > 0 else None), "an untimed target_only pass"


def ratio_of(ppl: float, base: float | None) -> float | None:
    return ppl / base if base and ppl == ppl else None


def untimed_points(
    cfg: DictConfig,
    setup: Setup,
    policies: Mapping[str, Policy],
    ladders: Mapping[str, list[float]],
    size: int,
    base: float | None,
) -> list[Point]:
    """Every rule at every value of its ladder, decoded untimed at batch `size` after a
    one-group warm-up of the rule (discarded)."""
    b = cfg.bench
    prompts = [p.input_ids for p in setup.prompts]
    seeds = [int(b.seed) + i for i in range(len(prompts))]
    budget, target = int(b.max_new_tokens), setup.models.target.model
    points = []
    for rule, policy in policies.items():
        field = FIELD[rule]
        for index, value in enumerate(ladders[rule]):
            at = at_threshold(policy, field, value)
            if index == 0:  # what the first value's speed should not pay
                setup.engine.generate(prompts[:size], at, budget, seeds[:size])
            untimed = decode_untimed(
                at, setup.engine, target, prompts, seeds, budget, int(b.guard.nll_batch_size), size
            )
            speed = untimed.tokens / untimed.wall_s if untimed.wall_s > 0 else None
            point = Point(rule, value, size, ratio_of(untimed.target_ppl, base), speed)
            points.append(point)
            log.info(
                "bench: frontier %s at %s %g, batch %d: perplexity ratio %s",
                rule,
                SYMBOL[rule],
                value,
                size,
                point.ppl_ratio,
            )
    return points


def chosen(points: Sequence[Point], bar: float) -> list[int]:
    """The points to time: those on the frontier by the untimed speed, and each rule's fastest
    within the bar by it."""
    pairs = [(p.untimed_tokens_per_s, p.ppl_ratio) for p in points]
    picked = {i for i, on in enumerate(pareto(pairs)) if on}
    for rule in RULES:
        own = [i for i, p in enumerate(points) if p.rule == rule]
        index = fastest_within([pairs[i] for i in own], bar)
        if index is not None:
            picked.add(own[index])
    return sorted(picked)


def time_points(
    cfg: DictConfig,
    setup: Setup,
    policies: Mapping[str, Policy],
    points: Sequence[Point],
    indices: Sequence[int],
    size: int,
) -> None:
    """Each chosen point timed as the bench times a method (warm-up, then every group of
    `size` prompts, the points interleaved per group): its `tokens_per_s`."""
    if not indices:
        return
    b = cfg.bench
    named = {points[i].name: points[i] for i in indices}
    timed = {
        name: at_threshold(policies[p.rule], FIELD[p.rule], p.threshold)
        for name, p in named.items()
    }
    decode = engine_decode(setup.engine, timed, int(b.max_new_tokens))
    runs = run_methods(
        decode,
        list(named),
        setup.prompts,
        size,
        int(b.seed),
        int(b.warmup_runs),
        None,
        int(b.min_timed_runs),
    )
    for name, groups in runs.items():
        tokens = sum(len(t) for run in groups for t in run.tokens)
        wall = sum(run.wall_s for run in groups)
        named[name].tokens_per_s = tokens / wall if wall > 0 else None


def trace_frontier(cfg: DictConfig, setup: Setup, results: dict[str, Any]) -> list[dict[str, Any]]:
    """results.json's `frontier` and `frontier_summary` (nothing when it does not run); the
    entries."""
    if not wanted(cfg, setup):
        return []
    given = settings(cfg.bench.get("frontier"))
    bar = settings_of(cfg.bench.get("guard"))["ppl_ratio"]
    sizes = [s for s in dict.fromkeys(given["batches"]) if s in setup.batch_sizes]
    left_out = [s for s in given["batches"] if s not in setup.batch_sizes]
    base, source = base_perplexity(cfg, setup, results)
    points: list[Point] = []
    absent: dict[str, str] = {}
    verdicts: dict[str, Any] = {}
    for size in sizes:
        policies, missing = rule_policies(cfg, setup, size)
        absent.update(missing)
        for rule in [r for r in policies if not given[r]]:
            absent[rule] = f"bench.frontier.{rule} is empty"
            del policies[rule]
        ladders = {rule: given[rule] for rule in policies}
        here = untimed_points(cfg, setup, policies, ladders, size, base)
        time_points(cfg, setup, policies, here, chosen(here, bar), size)
        verdicts[str(size)] = verdict([p.entry() for p in here], bar, given["verifier_vs_hand"])
        points += here
    sprinter = (setup.plan.settings.get("sprinter") or {}).get("verifier")
    results["frontier"] = [p.entry() for p in points]
    results["frontier_summary"] = {
        "bar": bar,
        "target_only_ppl": base,
        "target_only_ppl_from": source,
        "batches": sizes,
        "batches_not_run": left_out,
        "ladders": {rule: given[rule] for rule in RULES},
        "verifier": sprinter,
        "absent": absent,
        "timing": {
            "warmup_runs": int(cfg.bench.warmup_runs),
            "min_timed_runs": int(cfg.bench.min_timed_runs),
        },
        "untimed_tokens_per_s": [p.untimed_tokens_per_s for p in points],
        "verdicts": verdicts,
    }
    return results["frontier"]
