"""`decoding.compile=true` against `false` side by side in one run: the bench's engine methods
on the same prompts, each group decoded eager and compiled in turn (the order rotating), so
machine noise hits both alike.

Two bench runs one after the other read each other's drift: the same eager target_only,
run twice in a row on one CPU, can differ by more than compiling gains
(docs/results/compile-cpu.md). Here each variant gets its own
`stage=bench` set-up (models, latency profile, alpha, sd's gamma: what the method does on that
engine), and `bench.runs.run_methods` interleaves them as the bench interleaves its methods.
Warm-up (compilation included) is reported apart and never counted in tokens/s. With
`floor=true` the draft step is also timed against its floor (`stage=draft_eval`'s
`step_floor`) through each variant's engine.

    python benchmarks/compile_ab.py experiment=compile_ab 'bench.methods=[target_only,sd,svip]' \\
        bench.num_prompts=8 bench.max_new_tokens=32 'bench.batch_sizes=[1,4]' bench.gamma_max=3 \\
        bench.law_distance_prompts=0 bench.judge.enabled=false bench.energy=false [floor=true]

Writes artifacts/<experiment>/compile_ab/results.json and results.md.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sprinter_train.bench.draft.evaluate import measure_step_floor  # noqa: E402
from sprinter_train.bench.report.summary import speed  # noqa: E402
from sprinter_train.bench.report.tables import latency_table  # noqa: E402
from sprinter_train.bench.run.methods import at_batch_size  # noqa: E402
from sprinter_train.bench.run.prepare import Setup, prepare  # noqa: E402
from sprinter_train.bench.run.provenance import load_average  # noqa: E402
from sprinter_train.bench.run.runs import engine_decode, run_methods  # noqa: E402
from sprinter_train.core.config import compose_config  # noqa: E402
from sprinter_train.core.io import atomic_write, write_json  # noqa: E402
from sprinter_train.core.runtime import resolve_device, resolve_dtype, set_threads  # noqa: E402
from sprinter_train.decoding.builder import runner_layout  # noqa: E402

VARIANTS = {"eager": False, "compiled": True}  # name -> decoding.compile


def variant_cfg(cfg: DictConfig, variant: str) -> DictConfig:
    """The run's config with `decoding.compile` set for `variant`, in its own experiment
    folder (each variant's latency profile is its own)."""
    out = OmegaConf.merge(cfg, {"decoding": {"compile": VARIANTS[variant]}})
    out.experiment = f"{cfg.experiment}/compile_ab/{variant}"
    return out


def decode_sizes(cfg: DictConfig, setups: dict[str, Setup]) -> dict[str, Any]:
    """Every method of the bench, eager and compiled, interleaved per group at each size."""
    b = cfg.bench
    first = setups["eager"]
    methods = [n for n in first.names if n not in first.plan.peers]
    names = [f"{m}@{v}" for m in methods for v in setups]
    by_size: dict[str, Any] = {}
    for size in first.batch_sizes:
        decoders = {}
        for v, setup in setups.items():
            sized = at_batch_size(setup.plan, cfg, setup.gammas[size])
            decoders[v] = engine_decode(setup.engine, sized.policies, int(b.max_new_tokens))

        def decode(name: str, group: list, seeds: list, decoders=decoders):
            method, variant = name.split("@")
            return decoders[variant](method, group, seeds)

        warmup: dict[str, float] = {}
        before = load_average()
        runs = run_methods(
            decode,
            names,
            first.prompts,
            size,
            int(b.seed),
            int(b.warmup_runs),
            None,
            int(b.min_timed_runs),
            warmup,
        )
        measured = {name: speed(groups) for name, groups in runs.items()}
        rows = {}
        for m in methods:
            eager, compiled = measured[f"{m}@eager"], measured[f"{m}@compiled"]
            rows[m] = {
                "eager": eager,
                "compiled": compiled,
                "compiled_over_eager": compiled["tokens_per_s"] / eager["tokens_per_s"],
                "warmup_s": {v: warmup[f"{m}@{v}"] for v in setups},
                "same_tokens": [g.tokens for g in runs[f"{m}@eager"]]
                == [g.tokens for g in runs[f"{m}@compiled"]],
            }
        by_size[str(size)] = {
            "methods": rows,
            "load_average": {"start": before, "end": load_average()},
        }
    return by_size


def floors(cfg: DictConfig, setups: dict[str, Setup]) -> dict[str, Any]:
    """The batch-1 draft step against its floor through each variant's engine layout."""
    ecfg = cfg.draft_eval
    out = {}
    for v, setup in setups.items():
        models, decoding = setup.models, variant_cfg(cfg, v).decoding
        floor = measure_step_floor(
            models.draft.model,
            models.target.model,
            setup.engine.sampling,
            int(ecfg.context_tokens),
            int(ecfg.floor_reps),
            layout=runner_layout(decoding, setup.device),
            decoding=decoding,
        )
        out[v] = floor.report()
    return out


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# decoding.compile: compiled against eager ({result['experiment']})",
        "",
        f"{result['num_prompts']} prompts x {result['max_new_tokens']} new tokens, "
        f"{result['device']} ({result['dtype']}, {result['threads']} threads); each group "
        "decoded eager and compiled in turn. Warm-up (compile included) is not in tokens/s.",
        "",
        "| batch | method | eager tokens/s | compiled tokens/s | compiled / eager | "
        "same tokens | warm-up s eager / compiled |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for size, per in result["batches"].items():
        for m, row in per["methods"].items():
            lines.append(
                f"| {size} | {m} | {row['eager']['tokens_per_s']:.2f} | "
                f"{row['compiled']['tokens_per_s']:.2f} | {row['compiled_over_eager']:.3f} | "
                f"{'yes' if row['same_tokens'] else 'no'} | "
                f"{row['warmup_s']['eager']:.0f} / {row['warmup_s']['compiled']:.0f} |"
            )
    lines += ["", f"Lowest compiled / eager: {result['lowest_ratio']:.3f}", ""]
    for v, profile in result["latency_profiles"].items():
        lines += [f"Latency profile, {v} (ms per forward):", "", latency_table(profile), ""]
    for v, floor in result.get("floors", {}).items():
        lines.append(
            f"Draft step at batch 1, {v}: engine {floor['engine_step_ms']:.2f} ms, floor "
            f"{floor['floor_ms']:.2f} ms ({floor['engine_over_floor']:.2f}x), target step "
            f"{floor['target_step_ms']:.2f} ms"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> dict[str, Any]:
    floor = "floor=true" in argv
    cfg = compose_config(*[a for a in argv if not a.startswith("floor=")])
    set_threads(cfg.get("num_threads"))
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    setups = {v: prepare(variant_cfg(cfg, v), device, dtype) for v in VARIANTS}
    batches = decode_sizes(cfg, setups)
    result: dict[str, Any] = {
        "experiment": cfg.experiment,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "num_prompts": len(setups["eager"].prompts),
        "max_new_tokens": int(cfg.bench.max_new_tokens),
        "batches": batches,
        "lowest_ratio": min(
            row["compiled_over_eager"]
            for per in batches.values()
            for row in per["methods"].values()
        ),
        "latency_profiles": {
            v: {"by_batch": s.profile.by_batch(s.batch_sizes, int(cfg.bench.gamma_max) + 1)}
            for v, s in setups.items()
        },
    }
    if floor:
        result["floors"] = floors(cfg, setups)
    out = Path(cfg.experiment_dir) / "compile_ab"
    write_json(out / "results.json", result)
    text = markdown(result)
    atomic_write(out / "results.md", lambda tmp: tmp.write_text(text))
    print(text)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
