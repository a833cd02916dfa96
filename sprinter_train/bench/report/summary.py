"""The bench's figures per method, from its runs.

At every batch size: speed (tokens/s = generated tokens / wall time), speedups over
target_only and sd at that batch size, calls, tokens per target call, acceptance, where the
time goes, and ROUGE-L against target_only's output. On the batch-1 run only, the costlier
quality figures: ROUGE-L against the dataset's reference, the target's perplexity of the
output, energy per token and the judge's win-tie rate.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig
from tqdm.auto import tqdm

from sprinter_train.bench.quality.judge import Judge, build_judge, win_tie, win_tie_rate
from sprinter_train.bench.quality.scores import rouge_l, scored_mean, target_perplexities
from sprinter_train.bench.run.runs import GroupRun
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.batch import DecodeStats
from sprinter_train.models.roles import Roles

Runs = dict[str, list[GroupRun]]  # method -> its groups, in prompt order


def rows(runs: list[GroupRun]) -> list[tuple[Prompt, list[int]]]:
    """(prompt, generated tokens) of every row, in prompt order."""
    return [pair for run in runs for pair in zip(run.prompts, run.tokens, strict=True)]


def acceptance(stats: DecodeStats) -> dict[str, float | None]:
    """acceptance_rate: of the drafted tokens the target checked, the share it kept (sd's
    alpha); verifier_acceptance_rate: of all drafted tokens, the share committed on a
    verifier's word without a target check (sprinter's). None where no token was committed
    so: methods that never do (sd_learned, whose verifier only picks lengths, read 0.000
    before), and a sprinter whose verifier said no to every draft (then the target checked
    them all, and `acceptance_rate` is the whole story)."""
    checked = stats.drafted - stats.verifier_accepted
    return {
        "acceptance_rate": stats.accepted / checked if checked else None,
        "verifier_acceptance_rate": stats.verifier_accepted / stats.drafted
        if stats.verifier_accepted
        else None,
    }


def draft_acceptance(stats: DecodeStats) -> float | None:
    """Of the drafts the target tested, the share that passed (a round's drafts past its
    first rejection are never tested): accepted / (accepted + rounds with a rejection), the
    per-draft acceptance the records' beta estimates, so the bench can tell prompts unlike
    the training data's. None for a method that commits drafts unchecked, or tested none."""
    rejecting = stats.drafting_rounds - stats.full_rounds
    if stats.verifier_accepted or not stats.accepted + rejecting:
        return None
    return stats.accepted / (stats.accepted + rejecting)


DRAFT_RUNS = (
    "row_rounds",
    "drafted_per_round",
    "accepted_per_round",
    "no_draft_share",
    "all_accepted_share",
    "oracle_gap",
)


def draft_runs(stats: DecodeStats) -> dict[str, int | float | None]:
    """How long the rows' draft runs were against what the target kept, per row and round:
    how many rounds the rows had, drafts and kept drafts a round, the share of rounds that drafted nothing, the share of
    drafting rounds whose every draft was kept (the oracle length, drafting exactly what
    the target keeps, was at least the chosen one there) and, over rounds with a rejection,
    the mean |chosen - oracle| = drafted - kept. All None for a method that keeps no
    per-round tallies (HF's peers) or commits drafts unchecked (sprinter: no oracle here)."""
    n, drafting, full = stats.row_rounds, stats.drafting_rounds, stats.full_rounds
    if not n or stats.verifier_accepted:
        return dict.fromkeys(DRAFT_RUNS)
    rejecting = drafting - full
    values = (
        n,
        stats.drafted / n,
        stats.accepted / n,
        (n - drafting) / n,
        full / drafting if drafting else None,
        (stats.drafted - stats.accepted) / rejecting if rejecting else None,
    )
    return dict(zip(DRAFT_RUNS, values, strict=True))


def costs_ms(stats: DecodeStats) -> dict[str, float | None]:
    """Milliseconds per drafted token in the verifier and the companion (what a learned or
    table-driven length pays to choose) and in the draft, one drafting step's (a batched
    forward of every drafting row) and one target call's with the prompts' prefills taken
    out (what the latency profile prices); None where the method has no such part or drafted
    none."""

    def per(seconds: float, count: int) -> float | None:
        return 1e3 * seconds / count if count and seconds > 0 else None

    return {
        "verifier_per_draft": per(stats.verifier_seconds, stats.drafted),
        "companion_per_draft": per(stats.companion_seconds, stats.drafted),
        "draft_per_draft": per(stats.draft_seconds, stats.drafted),
        "draft_step": per(stats.draft_seconds, stats.draft_calls),
        "target_call": per(stats.target_seconds - stats.target_prefill_seconds, stats.target_calls),
    }


def speed(runs: list[GroupRun]) -> dict[str, Any]:
    """Tokens, wall time, calls, acceptance, the seconds inside each model's forwards, the
    per-round draft runs and what a drafted token cost."""
    stats = DecodeStats()
    for run in runs:
        stats.add(run.stats)
    tokens = sum(len(t) for run in runs for t in run.tokens)
    wall = sum(run.wall_s for run in runs)
    return {
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else float("nan"),
        "target_calls": stats.target_calls,
        "draft_calls": stats.draft_calls,
        "companion_calls": stats.companion_calls,
        "tokens_per_target_call": tokens / max(stats.target_calls, 1),
        **acceptance(stats),
        "draft_acceptance": draft_acceptance(stats),
        "time_breakdown_s": {
            "target": stats.target_seconds,
            "draft": stats.draft_seconds,
            "companion": stats.companion_seconds,
            "verifier": stats.verifier_seconds,
        },
        "prefill_s": {
            "target": stats.target_prefill_seconds,
            "draft": stats.draft_prefill_seconds,
            "companion": stats.companion_prefill_seconds,
        },
        "draft_runs": draft_runs(stats),
        "cost_ms": costs_ms(stats),
    }


def add_speedups(methods: dict[str, dict[str, Any]]) -> None:
    """speedup_vs_<ref>: tokens/s over the reference method's, run on the same prompts at the
    same batch size (None when the reference did not run)."""
    for row in methods.values():
        for ref in ("target_only", "sd"):
            base = methods.get(ref, {}).get("tokens_per_s")
            row[f"speedup_vs_{ref}"] = row["tokens_per_s"] / base if base else None


def texts(runs: Runs, tokenizer) -> dict[str, list[str]]:
    return {
        name: [tokenizer.decode(t, skip_special_tokens=True) for _, t in rows(rs)]
        for name, rs in runs.items()
    }


def rouge_vs_target(text: dict[str, list[str]], name: str) -> float:
    """Mean ROUGE-L (F1, in points) of a method's outputs against target_only's, row by row."""
    pairs = zip(text[name], text["target_only"], strict=True)
    return 100 * scored_mean(rouge_l(t, ref) for t, ref in pairs)


def summarise_batch(runs: Runs, tokenizer) -> dict[str, dict[str, Any]]:
    """Per method at one batch size: speed, calls, acceptance, time breakdown, speedups and
    ROUGE-L against target_only at that batch size."""
    text = texts(runs, tokenizer)
    methods = {name: speed(rs) for name, rs in runs.items()}
    if "target_only" in runs:
        for name, row in methods.items():
            row["rouge_l_vs_target"] = rouge_vs_target(text, name)
    add_speedups(methods)
    return methods


def make_judge(jcfg: Any, models: Roles) -> Judge | None:
    """The win-tie judge only when asked for: `endpoint` set, or `local` naming the loaded
    model that judges (target or draft, declared in stages/schema.py); a small local model calls nearly every pair a tie
    and costs a forward per pair and order, so it is never a default."""
    local = jcfg.get("local")
    if not jcfg.get("enabled", True) or not (jcfg.get("endpoint") or local):
        return None
    loaded = {"target": models.target, "draft": models.draft}.get(local or "")
    if jcfg.get("endpoint") or loaded is None:
        return build_judge(dict(jcfg))
    return build_judge(dict(jcfg), loaded.model, loaded.tokenizer)


def summarise(runs: Runs, models: Roles, tokenizer, cfg: DictConfig) -> dict[str, Any]:
    """Per method on the batch-1 run: speed, calls, acceptance, and quality (ROUGE-L, target
    perplexity, energy, win-tie)."""
    text = texts(runs, tokenizer)
    judge = make_judge(cfg.bench.judge, models)
    baseline = cfg.bench.judge.baseline
    judged = sum(len(rows(rs)) for n, rs in runs.items() if n != baseline)
    progress = tqdm(
        total=judged if judge is not None and baseline in runs else 0,
        desc="judge",
        unit="pair",
        disable=judge is None or baseline not in runs,
    )
    methods: dict[str, Any] = {}
    nll_batch = int(cfg.bench.guard.nll_batch_size)
    for name, rs in runs.items():
        pairs = rows(rs)
        ppls = target_perplexities(
            models.target.model, [(prompt.input_ids, tokens) for prompt, tokens in pairs], nll_batch
        )
        refs = [
            (t, prompt.reference)
            for t, (prompt, _) in zip(text[name], pairs, strict=True)
            if prompt.reference
        ]
        row: dict[str, Any] = {
            **speed(rs),
            "rouge_l_ref": 100 * sum(rouge_l(t, ref) for t, ref in refs) / len(refs)
            if refs
            else None,
            "target_ppl": scored_mean(ppls),
        }
        if "target_only" in runs:
            row["rouge_l_vs_target"] = rouge_vs_target(text, name)
        joules = [r.joules for r in rs]
        tokens = row["tokens"]
        row["joules_per_token"] = sum(joules) / tokens if None not in joules and tokens else None
        row["energy_note"] = None if row["joules_per_token"] is not None else rs[0].energy_reason
        if judge is not None and baseline in runs and name != baseline:
            outcomes = []
            for (prompt, _), t, tb in zip(pairs, text[name], text[baseline], strict=True):
                outcomes.append(win_tie(judge, prompt.text, t, tb))
                progress.update(1)
            row["win_tie_vs_" + baseline] = win_tie_rate(outcomes)
        methods[name] = row
    progress.close()
    add_speedups(methods)
    return {"methods": methods, "judge": None if judge is None else type(judge).__name__}


def greedy_differences(runs: Runs, greedy: bool) -> dict[str, int | None]:
    """Per method, how many outputs differ from target_only's under greedy decoding (0 for a
    lossless method in float32; in bfloat16 near-ties may flip); None when sampling is not
    greedy (outputs then differ by chance) or target_only did not run."""
    if not greedy or "target_only" not in runs:
        return {name: None for name in runs}
    reference = [tokens for _, tokens in rows(runs["target_only"])]
    return {
        name: sum(list(a) != list(b) for (_, a), b in zip(rows(rs), reference, strict=True))
        for name, rs in runs.items()
    }
