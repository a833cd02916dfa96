"""vLLM as a peer of the bench, run by sprinter_train/serving/vllm/run.py in a process of its
own under the interpreter `bench.vllm.python` (the vLLM venv: `make vllm-setup`):

- `vllm`: the target alone;
- `vllm_sd`: vLLM's `draft_model` speculative decoding with the bench's draft, a fixed number
  of drafts a round (`bench.vllm.num_speculative_tokens`; auto: sd's gamma at batch 1, 4
  where that is 0);
- `vllm_sd_learned`: the same, sd_learned's trained predictor choosing each request's drafts
  (at most that many) from an `stage=export export.method=sd_learned` folder the bench stage
  writes into its output folder.

One process per method decodes the bench's prompts (token ids), sampling, seeds (prompt i
with seed + i), budget and stop token at every batch size of the run, in the bench's
consecutive groups, each group timed after one untimed warm-up per batch size, under the
bench's thread count (`OMP_NUM_THREADS`). Its result becomes the bench's `GroupRun`s (a
group's seconds: the mean of its `bench.vllm.runs` timed runs, its tokens the first run's),
so the bench's figures follow as for any method: tokens/s = tokens / seconds, which is vLLM's
sum of generated tokens over the sum of seconds (the runs of a seeded group generate alike).
vLLM's own figures (engine start-up, acceptance = accepted / drafted tokens, drafts a round =
drafted tokens / drafting rounds) go beside them. Without the interpreter, or where
`import vllm` fails under it (checked once a process), or without a method's inputs, the
method is skipped with the reason (`PeerUnavailable`).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from sprinter_train.bench.run.runs import GroupRun, groups
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.batch import DecodeStats
from sprinter_train.models.loading import REPO_ROOT, ModelLoadError, local_folder

VLLM, VLLM_SD, VLLM_SD_LEARNED = "vllm", "vllm_sd", "vllm_sd_learned"
VLLM_NAMES = (VLLM, VLLM_SD, VLLM_SD_LEARNED)  # every vLLM peer: all batch sizes
DRAFTING = (VLLM_SD, VLLM_SD_LEARNED)
RUNNER = "sprinter_train.serving.vllm.run"
FALLBACK_DRAFTS = 4  # num_speculative_tokens=auto where sd drafts nothing
CPU_DTYPES = ("float32", "bfloat16")  # what vLLM's CPU backend runs
ENERGY_REASON = "not metered: vLLM decodes in a process of its own"
CHECK_TIMEOUT_S = 600  # `import vllm` takes seconds; a hung interpreter must not hang the bench


class PeerUnavailable(RuntimeError):
    """A vLLM method cannot run here: the message says why (the bench skips it)."""


def interpreter(setting: str | Path) -> Path:
    """`bench.vllm.python`, a relative path taken from the repository root."""
    path = Path(os.path.expanduser(str(setting)))
    return path if path.is_absolute() else REPO_ROOT / path


@functools.cache
def vllm_version(python: str) -> str:
    """vLLM's version under `python`, found once a process (importing vLLM takes seconds);
    PeerUnavailable where the interpreter is missing or the import fails there."""
    if not Path(python).exists():
        raise PeerUnavailable(
            f"no vLLM interpreter at {python} (bench.vllm.python; `make vllm-setup` makes "
            "the vLLM venv)"
        )
    try:
        done = subprocess.run(
            [python, "-c", "import vllm; print(vllm.__version__)"],
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            cwd=REPO_ROOT,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise PeerUnavailable(f"{python} could not import vllm: {error}") from error
    if done.returncode != 0:
        raise PeerUnavailable(f"`import vllm` fails under {python}: {tail(done.stderr)}")
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "?"


def tail(text: str, lines: int = 3) -> str:
    """The last lines of a process's output, on one line."""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:]) or "(nothing)"


def num_speculative_tokens(setting: Any, sd_gamma: int) -> int:
    """Drafts a round: the setting, or with `auto` sd's gamma (FALLBACK_DRAFTS where 0)."""
    if setting == "auto":
        return int(sd_gamma) if int(sd_gamma) >= 1 else FALLBACK_DRAFTS
    return int(setting)


def vllm_dtype(setting: str, bench_dtype: torch.dtype) -> str:
    """The dtype vLLM runs: the setting, or with `auto` the bench's where vLLM's CPU backend
    runs it (float16 runs as bfloat16)."""
    if setting != "auto":
        return str(setting)
    name = str(bench_dtype).removeprefix("torch.")
    return name if name in CPU_DTYPES else "bfloat16"


def plan_settings(
    name: str,
    vllm_cfg: Mapping[str, Any],
    specs: Mapping[str, Any],
    sd_gamma: int,
    compile: bool,
) -> dict[str, Any]:
    """What results.json records of a vLLM method before it runs, and what its request
    takes: the interpreter and vLLM's version, the target's (and draft's) local folders,
    the drafts a round, the dtype setting, the timed runs, compile, the KV cache's GiB on a
    CPU. PeerUnavailable where
    vLLM or an input is missing (`specs`: cfg.models as a dict)."""
    python = str(interpreter(vllm_cfg.get("python", ".venv-vllm/bin/python")))
    version = vllm_version(python)
    cache = specs.get("cache_dir")
    try:
        target = local_folder(specs["target"], cache)
        draft = local_folder(specs["draft"], cache) if name in DRAFTING else None
    except (ModelLoadError, KeyError, TypeError) as error:
        raise PeerUnavailable(f"{name} needs its models' local folders: {error}") from error
    drafts = vllm_cfg.get("num_speculative_tokens", "auto")
    return {
        "python": python,
        "vllm_version": version,
        "target": str(target),
        "draft": None if draft is None else str(draft),
        "predictor": None,  # vllm_sd_learned: the export folder the bench stage writes
        "num_speculative_tokens": num_speculative_tokens(drafts, sd_gamma) if draft else None,
        "dtype": str(vllm_cfg.get("dtype", "auto")),
        "runs": int(vllm_cfg.get("runs", 1)),
        "compile": bool(compile),
        "kv_cache_gib": None if (kv := vllm_cfg.get("kv_cache_gib")) is None else int(kv),
    }


def build_request(
    settings: Mapping[str, Any],
    prompts: Sequence[Prompt],
    *,
    sampling: SamplingConfig,
    max_new_tokens: int,
    seed: int,
    batch_sizes: Sequence[int],
    stop_token_ids: Sequence[int],
    dtype: str,
) -> dict[str, Any]:
    """run.py's request (its docstring): the method's folders and settings, the bench's
    prompts as token ids, sampling, budget, seed, batch sizes and stop tokens; the context
    holds the longest prompt, the budget and one round's drafts past it."""
    ids = [list(map(int, p.input_ids)) for p in prompts]
    drafts = int(settings.get("num_speculative_tokens") or 0)
    return {
        "target": settings["target"],
        "draft": settings.get("draft"),
        "predictor": settings.get("predictor"),
        "num_speculative_tokens": drafts or None,
        "dtype": dtype,
        "prompts": ids,
        "max_new_tokens": int(max_new_tokens),
        "sampling": {
            "temperature": float(sampling.temperature),
            "top_p": float(sampling.top_p),
            "top_k": int(sampling.top_k),
        },
        "seed": int(seed),
        "batch_sizes": [int(size) for size in batch_sizes],
        "runs": int(settings.get("runs", 1)),
        "max_model_len": max(map(len, ids)) + int(max_new_tokens) + drafts + 1,
        "stop_token_ids": [int(t) for t in stop_token_ids],
        "compile": bool(settings.get("compile", False)),
    }


def run_method(
    python: str, request: Mapping[str, Any], threads: int, kv_cache_gib: int | None = None
) -> dict[str, Any]:
    """run.py on the request in a process of its own under `threads` OpenMP threads (the
    bench's) and, on a CPU, `kv_cache_gib` GiB of KV cache (`VLLM_CPU_KVCACHE_SPACE`; None:
    vLLM's default, a share of the machine's memory, which the bench's own process leaves it
    short of), its result read back; PeerUnavailable with its output's end when it fails."""
    env = {**os.environ, "OMP_NUM_THREADS": str(int(threads))}
    # "" is vLLM's own default (run.py's otherwise applies only where this names none)
    env["VLLM_CPU_KVCACHE_SPACE"] = "" if kv_cache_gib is None else str(int(kv_cache_gib))
    with tempfile.TemporaryDirectory(prefix="vllm-peer-") as folder:
        asked, answer = Path(folder) / "request.json", Path(folder) / "result.json"
        asked.write_text(json.dumps(request))
        done = subprocess.run(
            [python, "-m", RUNNER, str(asked), str(answer)],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            env=env,
        )
        if done.returncode != 0 or not answer.exists():
            sys.stderr.write(done.stderr[-4000:])
            raise PeerUnavailable(
                f"vLLM's run ({RUNNER}) exited with {done.returncode}: {tail(done.stderr)}"
            )
        return json.loads(answer.read_text())


def group_runs(batch: Mapping[str, Any], prompts: Sequence[Prompt], size: int) -> list[GroupRun]:
    """One batch size of run.py's result as the bench's runs: each consecutive group with its
    prompts' tokens (the first timed run's) and the mean seconds of its timed runs (run.py
    times every group once a run, runs one after another)."""
    chunks = groups(len(prompts), size)
    seconds = [float(s) for s in batch["seconds"]]
    if not seconds or len(seconds) % len(chunks):
        raise ValueError(
            f"batch {size}: {len(seconds)} timed runs for {len(chunks)} groups of the prompts"
        )
    runs = len(seconds) // len(chunks)
    out = []
    for g, chunk in enumerate(chunks):
        wall = sum(seconds[r * len(chunks) + g] for r in range(runs)) / runs
        tokens = [list(map(int, batch["tokens"][i])) for i in chunk]
        group = [prompts[i] for i in chunk]
        out.append(GroupRun(group, tokens, wall, DecodeStats(), None, ENERGY_REASON))
    return out


def batch_figures(batch: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's figures at one batch size: tokens/s = generated tokens / seconds over every
    timed run, its speculative-decoding counters, acceptance = accepted / drafted tokens and
    drafts a round = drafted tokens / drafting rounds (None without drafts)."""
    seconds, made = sum(batch["seconds"]), sum(batch["generated"])
    counters = {k: float(v) for k, v in (batch.get("spec_decode") or {}).items()}
    drafted, rounds = counters.get("num_draft_tokens", 0.0), counters.get("num_drafts", 0.0)
    return {
        "tokens_per_s": made / seconds if seconds > 0 else float("nan"),
        "generated": int(made),
        "seconds": float(seconds),
        "timed_group_runs": len(batch["seconds"]),  # groups x runs
        "spec_decode": counters,
        "acceptance": counters.get("num_accepted_tokens", 0.0) / drafted if drafted else None,
        "drafts_per_round": drafted / rounds if rounds else None,
    }


def parse_result(
    result: Mapping[str, Any], prompts: Sequence[Prompt], batch_sizes: Sequence[int]
) -> tuple[dict[int, list[GroupRun]], dict[str, Any]]:
    """run.py's result as the bench's runs per batch size, and what results.json records of
    the run: start-up seconds, threads, versions and each batch size's vLLM figures."""
    runs, by_batch = {}, {}
    for size in batch_sizes:
        batch = result["batches"][str(size)]
        runs[int(size)] = group_runs(batch, prompts, int(size))
        by_batch[str(size)] = batch_figures(batch)
    record = {
        "startup_s": float(result["startup_s"]),
        "threads": result.get("threads"),
        "versions": result.get("versions") or {},
        "batches": by_batch,
    }
    return runs, record


def add_figures(
    results: dict[str, Any],
    settings: Mapping[str, Mapping[str, Any]],
    differing: Mapping[str, Mapping[str, int | None]],
) -> None:
    """vLLM's figures into results.json's rows (batch 1's and each batch size's): `vllm`
    (start-up seconds, threads, counters, its own tokens/s) and `acceptance_rate` from vLLM's
    counters; the calls vLLM does not report made None (`–`); at each batch size > 1 the
    outputs differing from target_only's there (`differing`: size -> method -> count, None
    where not greedy)."""
    batches = results.get("batches") or {}
    for name in VLLM_NAMES:
        record = (settings.get(name) or {}).get("run")
        if not record:
            continue
        for size, figures in record["batches"].items():
            rows = [(batches.get(size) or {}).get("methods", {}).get(name)]
            if size == "1":
                rows.append(results["methods"].get(name))
            for row in rows:
                if row is None:
                    continue
                row["vllm"] = {
                    "startup_s": record["startup_s"],
                    "threads": record["threads"],
                    **figures,
                }
                row["acceptance_rate"] = figures["acceptance"]
                for key in ("target_calls", "draft_calls", "tokens_per_target_call"):
                    row[key] = None
                if size != "1" and name in differing.get(size, {}):
                    row["outputs_differing_from_target_only"] = differing[size][name]
