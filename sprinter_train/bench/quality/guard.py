"""Quality where no reference is: the bench's bars that need no dataset
reference, set in `bench.guard`.

- Perplexity: a lossy method (its traits say `lossless: false`) must keep the target's
  perplexity of its output within `ppl_ratio` of target_only's on the same prompts. ROUGE-L
  against a reference sees nothing where the prompts have none, and a verifier that
  over-accepts off its training data writes text the target finds unlikely. A method that
  breaks it and has a threshold τ is decoded again at the stricter τ of
  `bench.guard.tau_ladder` (bench/quality/tau_ladder.py); the report names the one that holds it.
- Domain: a trained verifier's mean score over the bench's decodes against its train
  split's mean label (the sidecar's, which a calibrated score averages to), and the draft's
  acceptance here (sd's per tested draft) against the training data's (the soft-label
  verifier's train mean label, else the records' mean beta): far apart, the verifier runs
  on prompts unlike those it was fitted on, and its scores are not to be trusted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from sprinter_train.bench.report.cells import cell
from sprinter_train.core.config import conf_defaults

if TYPE_CHECKING:
    from sprinter_train.bench.run.methods import MethodPlan

ACCEPTANCE_FROM = ("sd", "oracle", "sd_heuristic")  # whose acceptance is the draft's own
BARS = ("ppl_ratio", "score_shift", "acceptance_ratio")  # bench.guard's bars


class ScoreTally:
    """A verifier as is, summing on the device the scores it gave the rows that drafted; the
    bench reads the mean once, after its runs (no host read mid-round)."""

    def __init__(self, verifier: Any) -> None:
        self.verifier = verifier
        self.total: torch.Tensor | None = None  # (sum of scores, rows scored)

    def __call__(self, engine, batch, rnd, step) -> torch.Tensor:
        return self.note(step, self.verifier(engine, batch, rnd, step))

    def note(self, step, score: torch.Tensor) -> torch.Tensor:
        """Add `score`, the rows' scores of `step`, to the tally (a policy that reads the
        scores its draft step computed calls this, `policies.base.step_score`)."""
        active = step.active
        part = torch.stack([torch.where(active, score.double(), 0.0).sum(), active.sum().double()])
        self.total = part if self.total is None else self.total + part
        return score

    def __getattr__(self, name: str) -> Any:  # prior, spec, observe: the verifier's own
        if "verifier" not in self.__dict__:  # a copy under construction
            raise AttributeError(name)
        return getattr(self.__dict__["verifier"], name)

    def mean(self) -> tuple[float | None, int]:
        """(mean score, rows scored); None before any score."""
        if self.total is None or not self.total[1]:
            return None, 0
        total, count = self.total.tolist()
        return total / count, int(count)


def tally_scores(plan: MethodPlan) -> None:
    """Wrap every trained verifier the plan's policies hold in a `ScoreTally`."""
    from sprinter_train.verifier.scorer import CheckpointVerifier

    for policy in plan.policies.values():
        verifier = getattr(policy, "verifier", None)
        if isinstance(verifier, CheckpointVerifier):
            policy.verifier = ScoreTally(verifier)  # type: ignore[attr-defined]


def tallies(plan: MethodPlan) -> dict[str, tuple[float | None, int]]:
    """Each tallied method's (mean score, rows scored) so far."""
    return {
        name: policy.verifier.mean()  # type: ignore[attr-defined]
        for name, policy in plan.policies.items()
        if isinstance(getattr(policy, "verifier", None), ScoreTally)
    }


def settings_of(guard: Mapping[str, Any] | None) -> dict[str, float]:
    """`bench.guard`'s bars (conf/bench/default.yaml's where a key is missing)."""
    given = {**conf_defaults("bench/default.yaml", "guard"), **(guard or {})}
    return {key: float(given[key]) for key in BARS}


def perplexity_bar(
    methods: dict[str, dict[str, Any]], traits: dict[str, dict[str, Any]], bar: float
) -> dict[str, Any]:
    """Each method's target perplexity over target_only's (`target_ppl_vs_target_only` in its
    row) and, per lossy method, whether it holds the bar; `broken` names those that do not."""
    base = (methods.get("target_only") or {}).get("target_ppl")
    lossy: dict[str, Any] = {}
    for name, row in methods.items():
        ppl = row.get("target_ppl")
        ok = base is not None and base == base and base > 0 and ppl is not None and ppl == ppl
        ratio = ppl / base if ok else None
        row["target_ppl_vs_target_only"] = ratio
        if name in traits and not traits[name]["lossless"]:
            lossy[name] = {
                "target_ppl": ppl,
                "ratio": ratio,
                "met": None if ratio is None else ratio <= bar,
            }
    broken = [name for name, entry in lossy.items() if entry["met"] is False]
    return {"bar": bar, "target_only_ppl": base, "methods": lossy, "broken": broken}


def measured_acceptance(methods: dict[str, dict[str, Any]]) -> tuple[str | None, float | None]:
    """(method, its per-tested-draft acceptance) of the first of ACCEPTANCE_FROM that ran."""
    for name in ACCEPTANCE_FROM:
        value = (methods.get(name) or {}).get("draft_acceptance")
        if value is not None:
            return name, value
    return None, None


def domain_check(
    results: dict[str, Any], scores: dict[str, tuple[float | None, int]], bars: dict[str, float]
) -> dict[str, Any]:
    """The trained verifiers' mean scores here against their train splits' mean labels, and
    the draft's acceptance here against the training data's; `flagged` when either is past
    its bar (`bench.guard.score_shift`, `.acceptance_ratio`). Empty without a trained
    verifier."""
    verifiers: dict[str, Any] = {}
    reference, source = None, None
    for name, settings in (results.get("settings") or {}).items():
        entry = settings.get("verifier") if isinstance(settings, dict) else None
        if not isinstance(entry, dict) or not entry.get("path"):
            continue  # none, or the online logistic: no training data to compare with
        prior = entry.get("prior")
        mean, count = scores.get(name, (None, 0))
        shift = None if mean is None or prior is None else mean - prior
        verifiers[name] = {
            "path": entry["path"],
            "label": entry.get("label", "ratio"),
            "train_mean_label": prior,
            "mean_score": mean,
            "scored": count,
            "shift": shift,
            "flagged": shift is not None and abs(shift) > bars["score_shift"],
        }
        if reference is None and entry.get("label") == "accept_prob" and prior is not None:
            reference, source = prior, f"the train split's mean acceptance ({name}'s verifier)"
    if not verifiers:
        return {}
    alpha_source = str(results.get("alpha_source") or "")
    if reference is None and alpha_source.startswith("records"):
        reference, source = results.get("alpha"), f"the records' mean beta ({alpha_source})"
    by, measured = measured_acceptance(results["methods"])
    ratio = measured / reference if measured is not None and reference else None
    factor = bars["acceptance_ratio"]
    acceptance = {
        "measured": measured,
        "by": by,
        "reference": reference,
        "reference_source": source,
        "ratio": ratio,
        "flagged": ratio is not None and not 1 / factor <= ratio <= factor,
    }
    flagged = acceptance["flagged"] or any(v["flagged"] for v in verifiers.values())
    return {
        "score_shift": bars["score_shift"],
        "acceptance_ratio": factor,
        "verifiers": verifiers,
        "acceptance": acceptance,
        "flagged": flagged,
    }


def guard_results(
    results: dict[str, Any], scores: dict[str, tuple[float | None, int]], guard: Mapping | None
) -> None:
    """results.json's `quality_guard` and `domain` from the batch-1 run."""
    bars = settings_of(guard)
    traits = results.get("traits") or {}
    results["quality_guard"] = perplexity_bar(results["methods"], traits, bars["ppl_ratio"])
    results["domain"] = domain_check(results, scores, bars)


def guard_warnings(results: dict[str, Any]) -> list[str]:
    """results.md's warnings at its top: a lossy method past the perplexity bar, a verifier
    on prompts unlike its training data."""
    lines = []
    bar = results.get("quality_guard") or {}
    for name in bar.get("broken") or []:
        entry = bar["methods"][name]
        lines.append(
            f"**Warning:** {name}'s output has target perplexity {cell(entry['target_ppl'], '{:.2f}')}, "
            f"{entry['ratio']:.2f}× target_only's {cell(bar['target_only_ppl'], '{:.2f}')} "
            f"(bar {bar['bar']:g}×, bench.guard.ppl_ratio): its quality is not the target's, "
            "whatever ROUGE-L says."
            + (" " + verdict if (verdict := ladder_verdict(name, bar)) else "")
        )
    domain = results.get("domain") or {}
    if domain.get("flagged"):
        lines.append(
            "**Warning:** a verifier runs on prompts unlike its training data (see "
            "'Verifiers on these prompts'): its scores, and the speed and quality of the methods "
            "that read them, are not those of its training domain."
        )
    return [line for warning in lines for line in (warning, "")]


def untried(entry: dict[str, Any], bar: dict[str, Any]) -> str:
    """Why a method past the bar was decoded at no stricter τ ('' when it was): an empty
    `bench.guard.tau_ladder` ('never') must not read as a ladder with nothing stricter."""
    if entry["tried"]:
        return ""
    if entry["tau"] is None:
        return "It has no τ to tighten."
    if bar.get("ladder") == []:
        return (
            f"No τ stricter than its {entry['tau']:g} was tried: bench.guard.tau_ladder is empty."
        )
    return f"No τ of bench.guard.tau_ladder is stricter than its {entry['tau']:g}."


def ladder_verdict(name: str, bar: dict[str, Any]) -> str:
    """Which τ of `bench.guard.tau_ladder` holds a method that broke the perplexity bar."""
    entry = (bar.get("tau_ladder") or {}).get(name)
    if entry is None:
        return ""
    if entry["holds"] is not None:
        return (
            f"A stricter τ holds it: methods.{name}.tau={entry['holds']:g} "
            f"(its τ {entry['tau']:g}; bench.guard.tau_ladder)."
        )
    if reason := untried(entry, bar):
        return reason
    return (
        f"No τ of bench.guard.tau_ladder holds it (tried up to {entry['tried'][-1]['tau']:g} "
        f"from its {entry['tau']:g})."
    )


def ladder_lines(bar: dict[str, Any]) -> list[str]:
    """results.md's account of the stricter τ each method past the bar was decoded at, or why
    it was decoded again at none."""
    lines: list[str] = []
    for name, entry in (bar.get("tau_ladder") or {}).items():
        if reason := untried(entry, bar):
            lines += [f"{name} was not decoded again. {reason}", ""]
            continue
        tries = "; ".join(
            f"τ {t['tau']:g}: {cell(t['target_ppl'], '{:.2f}')} ({cell(t['ratio'], '{:.2f}')}×"
            + (", met" if t["met"] else "")
            + ")"
            for t in entry["tried"]
        )
        lines += [
            f"{name} decoded again, untimed, on the same prompts and seeds at each τ of "
            f"bench.guard.tau_ladder stricter than its {cell(entry['tau'], '{:g}')} (stricter: "
            f"{entry['stricter']}), nearest first, until one holds the bar: {tries}. "
            + ladder_verdict(name, bar),
            "",
        ]
    return lines


def guard_section(results: dict[str, Any]) -> list[str]:
    """results.md's account of both bars."""
    lines: list[str] = []
    bar = results.get("quality_guard") or {}
    if bar.get("methods"):
        cells = "; ".join(
            f"{name} {cell(e['target_ppl'], '{:.2f}')} ({cell(e['ratio'], '{:.2f}')}×"
            + ("" if e["met"] is not False else ", **NOT met**")
            + ")"
            for name, e in bar["methods"].items()
        )
        lines += [
            "## Quality without a reference",
            "",
            f"Target perplexity of each lossy method's output against target_only's "
            f"{cell(bar['target_only_ppl'], '{:.2f}')} (bar ≤ {bar['bar']:g}×, "
            f"bench.guard.ppl_ratio): {cells}.",
            "",
        ]
        lines += ladder_lines(bar)
    domain = results.get("domain") or {}
    if domain.get("verifiers"):
        lines += [
            "## Verifiers on these prompts",
            "",
            "A trained verifier's mean score over this run's decodes (warm-ups and every batch "
            "size) against its train split's mean label, the mean its calibrated score has "
            f"there (flagged past ±{domain['score_shift']:g}, bench.guard.score_shift):",
            "",
            "| method | verifier | mean score here | train mean label | shift | flagged |",
            "|---|---|---|---|---|---|",
        ]
        for name, v in domain["verifiers"].items():
            lines.append(
                f"| {name} | {v['path'].rsplit('/', 1)[-1]} | {cell(v['mean_score'], '{:.3f}')} | "
                f"{cell(v['train_mean_label'], '{:.3f}')} | {cell(v['shift'], '{:+.3f}')} | "
                f"{'**yes**' if v['flagged'] else 'no'} |"
            )
        acc = domain["acceptance"]
        if acc["measured"] is not None and acc["reference"] is not None:
            verdict = "**unlike the training data**" if acc["flagged"] else "within the bar"
            lines += [
                "",
                f"The draft's acceptance here ({acc['by']}, per tested draft) "
                f"{acc['measured']:.3f} against {acc['reference']:.3f}, {acc['reference_source']}: "
                f"{cell(acc['ratio'], '{:.2f}')}× ({verdict}; bar {domain['acceptance_ratio']:g}× "
                "either way, "
                "bench.guard.acceptance_ratio).",
            ]
        lines.append("")
    return lines
