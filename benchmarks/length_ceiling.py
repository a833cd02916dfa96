"""How much a length policy or SPRINTER's verifier can buy at a pair, from its records and
latency profile: the ceilings behind the bench's learned-method bars.

    python benchmarks/length_ceiling.py experiment=sg1600
    python benchmarks/length_ceiling.py experiment=sg1600 --bench artifacts/sg1600/bench/results.json

Length policies are played on the test split's `draft` mix (tokens the draft drew from q, as an
sd round's drafts are): a round may start at any position, drafts up to `gamma_max` tokens
along the sequence, and is worth E(N) + 1 tokens, E(N) = sum_k prod_{i<=k} a_i with
a_i = min(1, p/q) of the i-th draft (its expected acceptance given the token), at the cost of
its drafting steps and the target's forward over the drafts + 1 (the latency profile at batch
1, the goodput model of decoding/policies/plans/goodput.py). Tokens a second over all rounds, as a ratio to the
best fixed gamma:

- `fixed gamma`: sd at a fixed width;
- `1 - TV before each draft`: a predictor that knows each draft's expected acceptance
  beta = sum_x min(p, q) before it is drawn and pays nothing to learn it (no policy that reads
  only the draft's state can know more);
- `exact a after each draw`: sd_learned's rule (score x_j after its draw; x_j's estimate stands
  in for x_{j+1}'s) with a perfect verifier;
- `sd_learned's rule`: the same rule with the experiment's soft-label verifier, calibrated
  (`--verifier` picks another), and beside it a fixed threshold on the product of its scores,
  the best of a grid (chosen on the test rows it is scored on: an upper bound for the form).

SPRINTER: the share of drafts a perfect verifier at each λ lets through (q/p <= λ) on the
`interleaved` mix (what its decoder leaves behind) and the `draft` mix; with `--bench`, the
share it must let through for `bench.targets.sprinter_vs_sd`, from the bench's own per-call and
per-draft costs of sprinter against sd's tokens a second.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sprinter_train.core.config import compose_config  # noqa: E402
from sprinter_train.decoding.policies.plans.goodput import round_goodput  # noqa: E402
from sprinter_train.evaluation.inputs import load_inputs  # noqa: E402
from sprinter_train.evaluation.scores import verifier_logits  # noqa: E402

THRESHOLDS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4)
# a policy: (a, beta, score) of the drafts a round could make, in order -> drafts it makes
Policy = Callable[[np.ndarray, np.ndarray, np.ndarray], int]


class Costs:
    """Milliseconds of a round: `draft` a drafting step, `target[k]` the target over k + 1
    tokens; `rises` is the decoder's own goodput test (decoding/goodput.round_goodput)."""

    def __init__(self, target_ms: Sequence[float], draft_ms: float) -> None:
        self.target, self.draft = list(target_ms), draft_ms

    def round_ms(self, drafts: int) -> float:
        return self.target[drafts] + drafts * self.draft

    def latency(self, rows: int, width: int) -> float:
        """The target over `width` tokens a row (the goodput model's `Seconds`)."""
        return self.target[width - 1]

    def step(self, rows: int) -> float:
        """One drafting step (the goodput model's `StepCost`)."""
        return self.draft

    def rises(self, expected: float, drafts: int, gain: float) -> bool:
        """Whether one more draft worth `gain` tokens raises the round's goodput."""
        now = round_goodput(expected, drafts, 1, self.latency, self.step)
        return bool(round_goodput(expected + gain, drafts + 1, 1, self.latency, self.step) > now)


def goodput(chains: list[tuple[np.ndarray, ...]], policy: Policy, costs: Costs, gmax: int) -> float:
    """Tokens a second over rounds started at every position of every sequence."""
    tokens = ms = 0.0
    for a, beta, score in chains:
        for s in range(len(a)):
            end = min(s + gmax, len(a))
            k = policy(a[s:end], beta[s:end], score[s:end])
            tokens += float(np.cumprod(a[s : s + k]).sum()) + 1.0
            ms += costs.round_ms(k)
    return 1000.0 * tokens / ms


def fixed(gamma: int) -> Policy:
    return lambda a, beta, score: min(gamma, len(a))


def before_the_draw(costs: Costs) -> Policy:
    """Draw x_j while its known expected acceptance beta_j raises the goodput."""

    def policy(a: np.ndarray, beta: np.ndarray, score: np.ndarray) -> int:
        k, product, expected = 0, 1.0, 0.0
        while k < len(a) and costs.rises(expected, k, product * beta[k]):
            product *= beta[k]
            expected += product
            k += 1
        return k

    return policy


def after_the_draw(costs: Costs, estimate: int) -> Policy:
    """sd_learned's rule (decoding/policies/learned.py) for a verifier that scores x_j after
    its draw: the first draft is drawn; after each, x_j's estimate (column `estimate`: 0 the
    exact a, 2 the verifier's score) joins the product and stands in for x_{j+1}'s."""

    def policy(*columns: np.ndarray) -> int:
        value = columns[estimate]
        k, product, expected = 0, 1.0, 0.0
        while k < len(value):
            product *= value[k]
            expected += product
            k += 1
            if k == len(value) or not costs.rises(expected, k, product * value[k - 1]):
                break
        return k

    return policy


def product_threshold(floor: float) -> Policy:
    """Draft on while the product of the verifier's scores so far stays at `floor` or above
    (the first draft always): a fixed threshold in place of the goodput test."""

    def policy(a: np.ndarray, beta: np.ndarray, score: np.ndarray) -> int:
        k, product = 0, 1.0
        while k < len(score):
            product *= score[k]
            k += 1
            if product < floor:
                break
        return k

    return policy


def chains_of(frame, rows: np.ndarray, score: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """(a, beta, score) of each test sequence of the draft mix, in position order."""
    part = frame.iloc[rows].assign(score=score).sort_values(["prompt_id", "position"])
    return [
        (g.accept_prob.to_numpy(float), g.beta.to_numpy(float), g.score.to_numpy(float))
        for _, g in part.groupby("prompt_id", sort=False)
    ]


def sprinter_needs(bench: dict, bar: float) -> dict[str, float]:
    """The share of drafts SPRINTER must commit on its verifier's word for `bar` x sd's tokens
    a second, at the bench's own per-call and per-draft costs of sprinter (n tokens a target
    call cost target and other seconds a call, draft and verifier seconds a draft)."""
    s, sd = bench["methods"]["sprinter"], bench["methods"]["sd"]
    calls = s["target_calls"] - bench["num_prompts"]  # prefills aside
    split = s["time_breakdown_s"]
    per_call = (split["target"] + s["wall_s"] - sum(split.values())) / calls
    per_draft = (split["draft"] + split["verifier"]) / s["draft_calls"]
    goal_ms = sd["wall_s"] / sd["tokens"] * 1000 / bar  # sprinter's ms a token at the bar
    n = per_call * 1000 / (goal_ms - per_draft * 1000)  # (per_call + n per_draft) / n = goal
    return {
        "tokens_per_call_needed": n,
        "verifier_share_needed": 1 - 1 / n,
        "measured_verifier_share": s["verifier_acceptance_rate"],
        "measured_vs_sd": s["speedup_vs_sd"],
    }


def bench_costs(bench_path: Path, experiment: str) -> tuple[dict, Costs, int]:
    """(the bench's results, its batch-1 round costs, its gamma_max), refused with the reason
    when the bench cannot price a round of one draft or more: checked before the records and
    verifiers are loaded, which takes minutes."""
    if not bench_path.is_file():
        raise SystemExit(
            f"{bench_path} is missing: the costs come from a bench's latency profile (run "
            f"stage=bench experiment={experiment}, or name one with --bench)"
        )
    try:
        bench = json.loads(bench_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SystemExit(f"{bench_path} is not a bench's results.json: {error}") from error
    profile = ((bench.get("latency_profile") or {}).get("by_batch") or {}).get("1")
    if profile is None:
        raise SystemExit(f"{bench_path} has no latency profile at batch 1 (by_batch['1'])")
    if not isinstance(bench.get("gamma_max"), int):
        raise SystemExit(f"{bench_path} names no gamma_max (the widest round it timed)")
    gmax = bench["gamma_max"]
    if gmax < 1:
        raise SystemExit(
            f"{bench_path} has gamma_max {gmax}: its latency profile prices no round with a "
            "draft, so there is no length to choose and no fixed gamma to compare with; name a "
            "bench run with bench.gamma_max >= 1"
        )
    widths = [str(k + 1) for k in range(gmax + 1)]
    missing = [w for w in widths if w not in (profile.get("target_ms") or {})]
    if missing:
        raise SystemExit(
            f"{bench_path}'s latency profile at batch 1 lacks the target over {missing} tokens "
            f"(gamma_max {gmax} needs 1..{gmax + 1})"
        )
    if profile.get("draft_ms") is None:
        raise SystemExit(f"{bench_path}'s latency profile at batch 1 lacks the draft's step")
    costs = Costs([profile["target_ms"][w] for w in widths], profile["draft_ms"])
    return bench, costs, gmax


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", type=Path, help="a bench's results.json with sprinter and sd")
    parser.add_argument(
        "--verifier",
        default="verifier_accept",
        help="the verifier sd_learned's rule reads, by its evaluate name (verifier_accept_mlp, "
        "verifier_lam1.2, ...)",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (experiment=...)")
    args = parser.parse_args()
    cfg = compose_config("stage=evaluate", *args.overrides)
    bench_path = args.bench or Path(cfg.experiment_dir) / "bench" / "results.json"
    bench, costs, gmax = bench_costs(bench_path, cfg.experiment)  # before the minutes of loading
    records, verifiers, _ = load_inputs(cfg)
    frame = records.frame

    rows = np.flatnonzero(((frame.split == "test") & (frame.mix == "draft")).to_numpy())
    if not len(rows):
        raise SystemExit(f"{cfg.experiment}'s records hold no test rows of the draft mix")
    name = args.verifier
    if name not in verifiers:
        raise SystemExit(f"no verifier {name} in {cfg.checkpoint_dir}: {sorted(verifiers)}")
    logits = verifier_logits(cfg, records, rows, {name: verifiers[name]})[name]
    score = np.asarray(verifiers[name].calibrated(logits))
    chains = chains_of(frame, rows, score)

    policies: dict[str, Policy] = {f"fixed gamma {g}": fixed(g) for g in range(1, gmax + 1)}
    policies["1 - TV before each draft"] = before_the_draw(costs)
    policies["exact a after each draw"] = after_the_draw(costs, 0)
    policies[f"sd_learned's rule, {name}"] = after_the_draw(costs, 2)
    rates = {k: goodput(chains, p, costs, gmax) for k, p in policies.items()}
    floors = {c: goodput(chains, product_threshold(c), costs, gmax) for c in THRESHOLDS}
    floor = max(floors, key=floors.__getitem__)
    rates[f"{name}, product of scores >= {floor:g} (best of {list(THRESHOLDS)})"] = floors[floor]
    best = max(v for k, v in rates.items() if k.startswith("fixed"))
    print(f"{cfg.experiment}: {len(rows)} test drafts of the draft mix, gamma_max {gmax}, ")
    print(f"draft step {costs.draft:.2f} ms, target {costs.target[0]:.2f} ms (1 token)\n")
    print("| length policy | tokens/s (model) | x best fixed gamma |\n|---|---:|---:|")
    for key, value in rates.items():
        print(f"| {key} | {value:.2f} | {value / best:.3f} |")

    lams = sorted({float(v.meta["lam"]) for v in verifiers.values() if v.meta.get("lam")})
    print("\n| mix | " + " | ".join(f"q/p <= {lam:g}" for lam in lams) + " |")
    print("|---|" + "---:|" * len(lams))
    for mix in ("interleaved", "draft"):
        ratio = frame.ratio[(frame.mix == mix) & (frame.split == "test")].to_numpy()
        print(f"| {mix} | " + " | ".join(f"{(ratio <= lam).mean():.3f}" for lam in lams) + " |")
    if "sprinter" in bench["methods"] and "sd" in bench["methods"]:
        bar = float(cfg.bench.targets.sprinter_vs_sd)
        need = sprinter_needs(bench, bar)
        print(
            f"\nsprinter at {bar}x sd needs {need['tokens_per_call_needed']:.2f} tokens a target "
            f"call: {need['verifier_share_needed']:.3f} of its drafts committed on the "
            f"verifier's word (measured: {need['measured_verifier_share']:.3f}, "
            f"{need['measured_vs_sd']:.2f}x sd)"
        )


if __name__ == "__main__":
    main()
