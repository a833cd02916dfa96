"""Two identical compiled `stage=bench` runs in fresh processes, one compile-cache folder: the
second should load its graphs from the first's cache.

    python benchmarks/compile_cache_ab.py                      # the offline pair, a temp folder
    python benchmarks/compile_cache_ab.py --root /tmp/cc_ab    # keep the runs' files there
    python benchmarks/compile_cache_ab.py models=tiny_random dtype=float32 num_threads=1

Each run is `python -m sprinter_train stage=bench` with `decoding.compile=true`, the same
`decoding.compile_cache=<root>/cache` (empty before the first run), and its own artifacts,
checkpoints and Hydra folders (`<root>/first`, `<root>/second`): the compile cache is the only
thing the second run can take from the first (a latency profile the first measured is not
reused). Both decode target_only and sd at a fixed width (`methods.sd.gamma=3`, the same shapes
whatever the profile says) at batch 1, greedy, without the judge. Trailing arguments are Hydra
overrides, applied over these settings (`models=` picks the pair; default: the offline one).

Prints, and writes to `<root>/compile_cache_ab.json` and `.md`: each run's compile seconds
(results.json `provenance.compile`), cache hits and misses, wall seconds; the second's compile
seconds over the first's; whether `tokens, target_calls, draft_calls, target_ppl` agree
method by method; whether the second results.md says its graphs came from the cache. Exits 1
when the ratio is above `--bar`, the figures differ, or the second run reports no cache hit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sprinter_train.core.io import atomic_write, write_json  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RUNS = ("first", "second")
SETTINGS = (
    "stage=bench",
    "experiment=compile_cache_ab",
    "sampling.temperature=0",
    "decoding.compile=true",
    "bench.methods=[target_only,sd]",
    "methods.sd.gamma=3",  # a fixed width: the same compiled shapes in both runs
    "bench.num_prompts=2",
    "bench.max_new_tokens=16",
    "bench.batch_sizes=[1]",
    "bench.latency.reps=1",
    "bench.judge.enabled=false",
)
SAME_TOKENS = ("tokens", "target_calls", "draft_calls", "target_ppl")
CACHE_WORDS = "graphs came from the compile cache"


def key_of(override: str) -> str:
    """The setting a Hydra override names (`+a.b=1` and `a.b=2` both name `a.b`)."""
    return override.split("=", 1)[0].lstrip("+~")


def overrides_for(root: Path, run: str, extra: Sequence[str] = ()) -> list[str]:
    """The run's overrides: SETTINGS and its folders, each replaced by an `extra` override of
    the same setting (Hydra refuses a setting named twice)."""
    own = [
        *SETTINGS,
        f"artifacts_root={root / run / 'artifacts'}",
        f"checkpoints_root={root / run / 'checkpoints'}",
        f"hydra.run.dir={root / run / 'hydra'}",
        f"decoding.compile_cache={root / 'cache'}",
    ]
    replaced = {key_of(o) for o in extra}
    return [o for o in own if key_of(o) not in replaced] + list(extra)


def setting(overrides: Sequence[str], key: str) -> str:
    """The value the last override of `key` gives it."""
    return [o.split("=", 1)[1] for o in overrides if key_of(o) == key][-1]


def bench_in_a_fresh_process(
    root: Path, run: str, extra: Sequence[str] = (), timeout: float | None = None
) -> dict[str, Any]:
    """One `stage=bench` process: its results.json, with what the stage printed about its
    compiles (`stage_compile`), the compile line of its results.md and its wall seconds."""
    overrides = overrides_for(root, run, extra)
    command = [sys.executable, "-m", "sprinter_train", *overrides]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{run} bench exited {done.returncode}:\n{done.stderr[-3000:]}")
    out = Path(setting(overrides, "artifacts_root")) / setting(overrides, "experiment") / "bench"
    results = json.loads((out / "results.json").read_text())
    # the stage's own result (printed last) says what it compiled, as every stage's does
    printed = json.loads(done.stdout[done.stdout.rindex("\n{") :])
    lines = (out / "results.md").read_text().splitlines()
    return {
        **results,
        "stage_compile": printed.get("compile") or {},
        "report_compile_line": next((ln for ln in lines if CACHE_WORDS in ln), None),
        "wall_seconds": round(wall, 1),
    }


def summary(run: dict[str, Any]) -> dict[str, Any]:
    """What one run compiled, what the cache served and how long the process took."""
    record = (run.get("provenance") or {}).get("compile") or {}
    return {
        "compile_seconds": float(record.get("seconds", 0.0)),
        "cache_hits": int(record.get("cache_hits", 0)),
        "cache_misses": int(record.get("cache_misses", 0)),
        "cache_hit": bool(record.get("cache_hit", False)),
        "stage_cache_hit": bool((run.get("stage_compile") or {}).get("cache_hit", False)),
        "wall_seconds": run.get("wall_seconds"),
    }


def differing(first: dict[str, Any], again: dict[str, Any]) -> dict[str, list[str]]:
    """Per method, the SAME_TOKENS figures the runs disagree on (a method one run lacks:
    all of them)."""
    a, b = first.get("methods") or {}, again.get("methods") or {}
    out = {}
    for method in sorted(set(a) | set(b)):
        if method not in a or method not in b:
            out[method] = list(SAME_TOKENS)
            continue
        keys = [k for k in SAME_TOKENS if a[method].get(k) != b[method].get(k)]
        if keys:
            out[method] = keys
    return out


def says_cache_hit(line: str | None, hits: int) -> bool:
    """Whether a results.md compile line says all `hits` graphs came from the cache."""
    return (
        line is not None
        and hits > 0
        and f"{hits} of {hits} {CACHE_WORDS}" in line
        and "a cache hit" in line
    )


def compare(first: dict[str, Any], again: dict[str, Any], bar: float) -> dict[str, Any]:
    """The A/B's verdict: the second run's compile seconds over the first's within `bar`, the
    same tokens, and the second run's graphs all from the cache; `failures` says what broke."""
    cold, warm = summary(first), summary(again)
    ratio = (
        warm["compile_seconds"] / cold["compile_seconds"] if cold["compile_seconds"] > 0 else None
    )
    diff = differing(first, again)
    report_says = says_cache_hit(again.get("report_compile_line"), warm["cache_hits"])
    failures = []
    if ratio is None:
        failures.append("the first run compiled nothing: no ratio")
    elif ratio > bar:
        failures.append(f"second/first compile seconds {ratio:.3f} above the bar {bar}")
    if not (first.get("methods") and again.get("methods")):
        failures.append("a run decoded no method")
    if diff:
        failures.append(f"the runs' figures differ: {diff}")
    if not warm["cache_hit"]:
        failures.append("the second run reports no cache hit")
    if not report_says:
        failures.append("the second results.md does not say its graphs came from the cache")
    return {
        "runs": {"first": cold, "second": warm},
        "ratio": ratio,
        "bar": bar,
        "same_tokens": not diff,
        "differing": diff,
        "report_says_cache_hit": report_says,
        "report_compile_line": again.get("report_compile_line"),
        "failures": failures,
        "passed": not failures,
    }


def markdown(verdict: dict[str, Any]) -> str:
    """The verdict as a short table and the checks beneath it."""
    rows = [
        "| run | compile s | cache hits | cache misses | cache hit | wall s |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for name, run in verdict["runs"].items():
        rows.append(
            f"| {name} | {run['compile_seconds']:.1f} | {run['cache_hits']} | "
            f"{run['cache_misses']} | {'yes' if run['cache_hit'] else 'no'} | "
            f"{run['wall_seconds']} |"
        )
    ratio = verdict["ratio"]
    shown = "n/a" if ratio is None else f"{ratio:.3f}"
    rows += [
        "",
        f"- second/first compile seconds: {shown} (bar {verdict['bar']})",
        f"- {', '.join(SAME_TOKENS)} identical per method: "
        f"{'yes' if verdict['same_tokens'] else 'no ' + str(verdict['differing'])}",
        "- the second results.md says its graphs came from the cache: "
        f"{'yes' if verdict['report_says_cache_hit'] else 'no'}",
        f"- verdict: {'PASS' if verdict['passed'] else 'FAIL: ' + '; '.join(verdict['failures'])}",
    ]
    return "\n".join(rows) + "\n"


def run_pair(root: Path, extra: Sequence[str], bar: float, timeout: float | None) -> dict:
    """Both runs against `root`'s cache, the verdict written into `root`."""
    runs = [bench_in_a_fresh_process(root, run, extra, timeout) for run in RUNS]
    verdict = {**compare(*runs, bar), "overrides": list(extra), "root": str(root)}
    write_json(root / "compile_cache_ab.json", verdict)
    text = markdown(verdict)
    atomic_write(root / "compile_cache_ab.md", lambda tmp: tmp.write_text(text))
    return verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, help="an empty or new folder (default: a temp one)")
    parser.add_argument("--bar", type=float, default=0.2, help="second/first compile s, at most")
    parser.add_argument("--timeout", type=float, default=None, help="seconds a run, at most")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (models=tiny_random)")
    args = parser.parse_args()
    root = (args.root or Path(tempfile.mkdtemp(prefix="compile_cache_ab_"))).resolve()
    if root.exists() and any(root.iterdir()):
        parser.error(f"{root} is not empty: the first run must find no compile cache")
    root.mkdir(parents=True, exist_ok=True)
    verdict = run_pair(root, args.overrides, args.bar, args.timeout)
    print(markdown(verdict), end="")
    print(f"written: {root / 'compile_cache_ab.json'}, {root / 'compile_cache_ab.md'}")
    sys.exit(0 if verdict["passed"] else 1)


if __name__ == "__main__":
    main()
