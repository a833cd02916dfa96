"""stage=draft_eval: how good is the draft for speculative decoding on this machine?

python -m sprinter_train stage=draft_eval experiment=<name> [models=...]

Reports alpha (mean sum_x min(p, q)) on held-out assistant replies (draft_eval.source and
split: ShareGPT's test split by default), greedy agreement, the latency ratio c, the cost of
verifying gamma + 1 tokens, and the implied SD speedup; and the draft step's floor (a bare
matmul chain over its weights) beside its model-only and engine steps (bench/step_floor.py).
draft_eval.extra_sources are scored beside the main source (`by_source`): HumanEval problems,
or the target's own sampled replies to held-out ShareGPT turns (target_replies).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase

from sprinter_train.bench import provenance
from sprinter_train.bench.latency import profile_models
from sprinter_train.bench.step_floor import measure_step_floor
from sprinter_train.core.distributions import acceptance_alpha, implied_speedup
from sprinter_train.core.io import atomic_write, write_json
from sprinter_train.core.runtime import resolve_device, resolve_dtype, set_threads
from sprinter_train.core.sampling import SamplingConfig, warp_probs
from sprinter_train.data.chat import chat_ids, reply_ids
from sprinter_train.data.exchanges import EXCHANGE_SOURCES, FIXED_SPLITS
from sprinter_train.data.split import SPLITS, split_settings
from sprinter_train.distill.onpolicy import block_seed, pad_id_of, sample_replies
from sprinter_train.models.loading import (
    LoadedModel,
    check_tokenizers_agree,
    load_model,
    resolve_path,
)

log = logging.getLogger(__name__)


TARGET_REPLIES = "target_replies"
# every draft_eval.source / extra_sources value: the text sources, then the target's own replies
SOURCES = (*EXCHANGE_SOURCES, TARGET_REPLIES)
Exchange = tuple[list[int], int]  # (token ids, index of the first reply token)


def check_sources(ecfg: Mapping[str, Any]) -> list[str]:
    """`source`, then each of `extra_sources` not already listed; refuses an unknown name
    before any model loads."""
    extras = [("extra_sources", str(s)) for s in ecfg.get("extra_sources") or []]
    named = [("source", str(ecfg["source"])), *extras]
    for key, name in named:
        if name not in SOURCES:
            raise ValueError(
                f"draft_eval.{key} names {name!r}, which has no (user, reply) exchanges; "
                f"choose from {', '.join(SOURCES)}"
            )
    return list(dict.fromkeys(name for _, name in named))


def source_split(source: str, ecfg: Mapping[str, Any]) -> str:
    """The split a source's exchanges come from (HumanEval: all of it, see data/exchanges.py)."""
    return FIXED_SPLITS.get(source, str(ecfg["split"]))


def exchange_shape(ecfg: Mapping[str, Any]) -> tuple[int, int]:
    """(seq_len, tokens the prompt keeps) after checking split and prompt_fraction."""
    split = str(ecfg["split"])
    if split not in SPLITS:
        raise ValueError(f"draft_eval.split must be one of {', '.join(SPLITS)}, got {split!r}")
    seq_len, fraction = int(ecfg["seq_len"]), float(ecfg["prompt_fraction"])
    if not 0 < fraction < 1:
        raise ValueError(f"draft_eval.prompt_fraction must lie in (0, 1), got {fraction}")
    return seq_len, max(1, int(seq_len * fraction))


def heldout_exchanges(
    tokenizer: PreTrainedTokenizerBase,
    ecfg: Mapping[str, Any],
    data_cfg: Mapping[str, Any],
    source: str | None = None,
) -> list[Exchange]:
    """(token ids, index of the first reply token) of `num_sequences` exchanges of `source`
    (default `draft_eval.source`) from `split` (split by id as `data` splits): the
    chat-rendered user turn, cut to its last seq_len * prompt_fraction tokens, then the reply,
    seq_len tokens in all; exchanges with fewer than `min_reply_tokens` reply tokens left are
    skipped. Text sources only: target_replies needs the target (`target_exchanges`)."""
    source = str(ecfg["source"]) if source is None else source
    if source not in EXCHANGE_SOURCES:
        raise ValueError(
            f"draft_eval.source={source!r} has no (user, reply) text exchanges; choose from "
            f"{', '.join(EXCHANGE_SOURCES)} (or {TARGET_REPLIES}, sampled from the target)"
        )
    seq_len, keep = exchange_shape(ecfg)
    out: list[Exchange] = []
    for user, reply in EXCHANGE_SOURCES[source](str(ecfg["split"]), split_settings(data_cfg)):
        prompt = chat_ids(tokenizer, user, max_user_chars=ecfg["max_user_chars"])[-keep:]
        ids = (prompt + reply_ids(tokenizer, reply))[:seq_len]
        if len(ids) - len(prompt) >= int(ecfg["min_reply_tokens"]):
            out.append((ids, len(prompt)))
        if len(out) >= int(ecfg["num_sequences"]):
            break
    return out


def target_exchanges(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    ecfg: Mapping[str, Any],
    data_cfg: Mapping[str, Any],
    sampling: Mapping[str, Any],
) -> list[Exchange]:
    """Exchanges whose reply is the target's own sample at `sampling`, the text speculative
    decoding meets (the draft learnt from human replies): ShareGPT's `split` user turns in
    order, prompts cut as in `heldout_exchanges`, each reply drawn (through its first EOS) up
    to the seq_len tokens the exchange holds. Prompts go in blocks of the exchanges still
    missing, block b seeded with `block_seed(seed, b)`, so a run reproduces its replies."""
    seq_len, keep = exchange_shape(ecfg)
    wanted, shortest = int(ecfg["num_sequences"]), int(ecfg["min_reply_tokens"])
    users = EXCHANGE_SOURCES["sharegpt_package"](str(ecfg["split"]), split_settings(data_cfg))
    prompts = (
        chat_ids(tokenizer, u, max_user_chars=ecfg["max_user_chars"])[-keep:] for u, _ in users
    )
    pad_id = pad_id_of(tokenizer)
    out: list[Exchange] = []
    block = 0
    while len(out) < wanted:
        chunk = list(islice(prompts, wanted - len(out)))
        if not chunk:
            break
        rows = sample_replies(
            model,
            chunk,
            pad_id,
            int(tokenizer.eos_token_id),
            dict(sampling),
            seq_len - min(len(p) for p in chunk),
            block_seed(int(ecfg.get("seed", 0)), block),
        )
        for prompt, row in zip(chunk, rows, strict=True):
            if min(len(row), seq_len) - len(prompt) >= shortest:
                out.append((row[:seq_len], len(prompt)))
        block += 1
    return out


def source_exchanges(
    source: str, target: LoadedModel, ecfg: Mapping[str, Any], cfg: DictConfig
) -> list[Exchange]:
    """One source's exchanges: text pairs tokenised, or replies sampled from the target."""
    if source == TARGET_REPLIES:
        sampling = OmegaConf.to_container(cfg.sampling, resolve=True)
        return target_exchanges(target.model, target.tokenizer, ecfg, cfg.data, sampling)
    return heldout_exchanges(target.tokenizer, ecfg, cfg.data, source)


def measure_sources(
    sources: list[str],
    draft: LoadedModel,
    target: LoadedModel,
    ecfg: Mapping[str, Any],
    cfg: DictConfig,
    settings: dict[str, SamplingConfig],
    device: torch.device,
) -> dict[str, dict[str, Any]]:
    """alpha per setting, greedy agreement and counts of every source, in the order given."""
    by_source: dict[str, dict[str, Any]] = {}
    for source in sources:
        started = time.perf_counter()
        exchanges = source_exchanges(source, target, ecfg, cfg)
        if not exchanges:
            raise ValueError(
                f"draft_eval.source {source!r} gave no exchange with >= "
                f"{ecfg['min_reply_tokens']} reply tokens in {ecfg['seq_len']} tokens"
            )
        quality = measure_alpha(draft.model, target.model, exchanges, settings, device)
        by_source[source] = {
            "split": source_split(source, ecfg),
            "alpha": quality["alpha"]["default"],
            "alpha_by_setting": quality["alpha"],
            "greedy_agreement": quality["greedy_agreement"],
            "positions": quality["positions"],
            "sequences": len(exchanges),
            "seconds": time.perf_counter() - started,
        }
        log.info("draft_eval %s: %s", source, by_source[source])
    return by_source


@torch.no_grad()
def measure_alpha(
    draft, target, exchanges, settings: dict[str, SamplingConfig], device
) -> dict[str, Any]:
    """Teacher-forced alpha and greedy agreement at every assistant position."""
    sums = {name: 0.0 for name in settings}
    agree, count = 0.0, 0
    for ids, start in exchanges:
        x = torch.tensor([ids], device=device)
        # logits at position t-1 predict token t: assistant tokens are start..len-1
        p_logits = target(input_ids=x).logits[0, start - 1 : -1].float()
        q_logits = draft(input_ids=x).logits[0, start - 1 : -1].float()
        for name, sampling in settings.items():
            sums[name] += float(
                acceptance_alpha(
                    warp_probs(p_logits, sampling), warp_probs(q_logits, sampling)
                ).sum()
            )
        agree += float((p_logits.argmax(-1) == q_logits.argmax(-1)).sum())
        count += p_logits.shape[0]
    return {
        "alpha": {k: v / count for k, v in sums.items()},
        "greedy_agreement": agree / count,
        "positions": count,
    }


@torch.no_grad()
def measure_latency(
    draft, target, gammas: list[int], reps: int, context: int, device
) -> dict[str, Any]:
    """Median KV-cached step times (interleaved rounds) and the ratios SD's speedup needs."""
    profile = profile_models(target, draft, None, max(gammas), reps, context, device)
    sizes = sorted({1, *[g + 1 for g in gammas]})
    return {
        "draft_step_ms": profile.draft_ms,
        "target_step_ms": profile.target_ms[1],
        "target_forward_ms": {n: profile.target_ms[n] for n in sizes},
        "c": profile.c,
        "verify_cost": {g: profile.verify_cost(g) for g in gammas},
    }


def run(cfg: DictConfig) -> dict[str, Any]:
    ecfg = cfg.draft_eval
    sources = check_sources(ecfg)
    exchange_shape(ecfg)
    set_threads(cfg.get("num_threads"))
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    started = provenance.start(cfg, device, dtype)
    specs = OmegaConf.to_container(cfg.models, resolve=True)
    cache, packed = specs.get("cache_dir"), bool(specs.get("pack_linear", False))
    target = load_model(specs["target"], "target", device, dtype, cache, packed)
    draft = load_model(specs["draft"], "draft", device, dtype, cache, packed)
    check_tokenizers_agree([target, draft])

    default = SamplingConfig.from_cfg(cfg.sampling)
    settings = {
        "default": default,
        **{f"T={t:g}": SamplingConfig(temperature=float(t)) for t in ecfg.temperatures},
    }
    by_source = measure_sources(sources, draft, target, ecfg, cfg, settings, device)
    quality = by_source[sources[0]]
    gammas = [int(g) for g in ecfg.gammas]
    latency = measure_latency(
        draft.model, target.model, gammas, ecfg.latency_reps, ecfg.context_tokens, device
    )
    floor = measure_step_floor(
        draft.model, target.model, default, int(ecfg.context_tokens), int(ecfg.floor_reps)
    ).report()
    step_targets = OmegaConf.to_container(ecfg.get("step_targets") or {})
    floor["targets"] = step_targets
    floor["targets_met"] = {name: floor[name] <= goal for name, goal in step_targets.items()}
    alpha = quality["alpha"]
    speedup = {
        g: implied_speedup(alpha, g, latency["c"], latency["verify_cost"][g]) for g in gammas
    }
    best = max(speedup, key=speedup.get)
    targets = OmegaConf.to_container(ecfg.get("targets") or {})
    values = headline(alpha, latency["c"], speedup[best])
    met = {name: meets(name, values[name], goal) for name, goal in targets.items()}
    result = {
        "draft": draft.name,
        "target": target.name,
        "sampling": OmegaConf.to_container(cfg.sampling),
        "alpha": alpha,
        "alpha_by_setting": quality["alpha_by_setting"],
        "greedy_agreement": quality["greedy_agreement"],
        "positions": quality["positions"],
        "sequences": quality["sequences"],
        "by_source": by_source,
        **latency,
        "implied_speedup": speedup,
        "best_gamma": best,
        "targets": targets,
        "targets_met": met,
        "step_floor": floor,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "provenance": provenance.finish(
            started, models=provenance.model_hashes({"target": target, "draft": draft})
        ),
    }
    out = Path(cfg.experiment_dir) / "draft_eval.json"
    write_json(out, result)
    print(format_table(result))
    if ecfg.get("update_model_card"):
        update_model_card(
            Path(resolve_path(str(specs["draft"]["path"]))) / "README.md", result, cfg
        )
    log.info("wrote %s", out)
    return result


def headline(alpha: float, c: float, best_speedup: float) -> dict[str, float]:
    """The three figures the draft is judged by."""
    return {"alpha": alpha, "c": c, "implied_speedup": best_speedup}


def meets(name: str, value: float, goal: float) -> bool:
    """c is a cost (lower is better); alpha and speedup are gains."""
    return value <= goal if name == "c" else value >= goal


CARD_BEGIN, CARD_END = "<!-- draft_eval:begin -->", "<!-- draft_eval:end -->"


def update_model_card(card: Path, result: dict[str, Any], cfg: DictConfig) -> None:
    """Replace the card's measured-figures section with this run's (only cards we wrote)."""
    if not card.exists():
        log.warning("no model card at %s; figures stay in draft_eval.json", card)
        return
    text = card.read_text()
    section = (
        f"{CARD_BEGIN}\n## Measured (stage=draft_eval, {time.strftime('%Y-%m-%d', time.gmtime())})\n\n"
        f"`python -m sprinter_train stage=draft_eval experiment={cfg.experiment}` on "
        f"{result['device']} with {result['threads']} threads, {result['sequences']} held-out "
        f"replies ({cfg.draft_eval.source}, {cfg.draft_eval.split} split; {result['positions']} "
        f"positions):\n\n```\n{format_table(result)}\n```\n"
        f"{CARD_END}\n"
    )
    if CARD_BEGIN in text and CARD_END in text:
        head, rest = text.split(CARD_BEGIN, 1)
        text = head + section + rest.split(CARD_END, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    atomic_write(card, lambda tmp: tmp.write_text(text))


def format_table(result: dict[str, Any]) -> str:
    lines = [
        f"draft {result['draft']}  vs  target {result['target']}",
        "alpha: "
        + ", ".join(f"{k} {v:.3f}" for k, v in result["alpha_by_setting"].items())
        + f"  (default = {result['sampling']})",
        f"greedy agreement {result['greedy_agreement']:.3f} over {result['positions']} positions",
        f"step: draft {result['draft_step_ms']:.2f} ms, target {result['target_step_ms']:.2f} ms, "
        f"c = {result['c']:.3f}",
        "gamma | verify cost | implied speedup",
    ]
    for g, s in result["implied_speedup"].items():
        lines.append(f"{g:>5} | {result['verify_cost'][g]:>11.2f} | {s:>6.3f}")
    lines.append(
        f"best gamma {result['best_gamma']}: implied speedup "
        f"{result['implied_speedup'][result['best_gamma']]:.3f}"
    )
    if len(result.get("by_source", {})) > 1:
        lines.extend(format_sources(result["by_source"]))
    values = headline(result["alpha"], result["c"], result["implied_speedup"][result["best_gamma"]])
    for name, goal in result.get("targets", {}).items():
        sign = "<=" if name == "c" else ">="
        verdict = "met" if result["targets_met"][name] else "NOT met"
        lines.append(f"target {name} {sign} {goal}: {verdict} ({values[name]:.3f})")
    if "step_floor" in result:
        lines.extend(format_floor(result["step_floor"]))
    return "\n".join(lines)


def format_sources(by_source: dict[str, dict[str, Any]]) -> list[str]:
    """alpha per setting and greedy agreement of every source, the main one first."""
    settings = list(next(iter(by_source.values()))["alpha_by_setting"])
    names = {name: f"{name} ({entry['split']})" for name, entry in by_source.items()}
    width = max(len(label) for label in names.values())
    header = " | ".join(f"alpha {s}" for s in settings)
    lines = [f"{'source (split)':<{width}} | {header} | greedy | positions"]
    for name, entry in by_source.items():
        cells = " | ".join(f"{entry['alpha_by_setting'][s]:>{len(s) + 6}.3f}" for s in settings)
        lines.append(
            f"{names[name]:<{width}} | {cells} | {entry['greedy_agreement']:>6.3f} | "
            f"{entry['positions']:>9}"
        )
    return lines


def format_floor(floor: dict[str, Any]) -> list[str]:
    """The draft step against its floor, and the step targets (both costs: lower is better);
    a c target below the floor's own c is called unreachable at this format."""
    lines = [
        f"draft step at batch 1 after {floor['context_tokens']} cached tokens (median of "
        f"{floor['reps']} interleaved rounds):",
        f"  floor  {floor['floor_ms']:6.2f} ms  ({floor['floor_matmuls']} matmuls over "
        f"{floor['floor_parameters'] / 1e6:.2f}M weights, {floor['floor_weight_mb']:.1f} MB: "
        f"{floor['floor_gb_per_s']:.1f} GB/s)",
        f"  model  {floor['model_step_ms']:6.2f} ms  ({floor['model_over_floor']:.2f}x the floor)",
        f"  engine {floor['engine_step_ms']:6.2f} ms  ({floor['engine_over_floor']:.2f}x the floor)",
        f"  target {floor['target_step_ms']:6.2f} ms  (c: engine {floor['c_engine']:.3f}, "
        f"floor {floor['c_floor']:.3f})",
    ]
    for name, goal in floor.get("targets", {}).items():
        verdict = "met" if floor["targets_met"][name] else "NOT met"
        line = f"target {name} <= {goal}: {verdict} ({floor[name]:.3f})"
        if name == "c_engine" and floor["c_floor"] > goal:
            line += (
                f"; unreachable at this format: the floor alone gives c = {floor['c_floor']:.3f}"
            )
        lines.append(line)
    return lines
