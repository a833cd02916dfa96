"""stage=bench: every method on the same prompts, side by side, speed and quality, at every
batch size of `bench.batch_sizes`.

python -m sprinter_train stage=bench experiment=<exp> [bench.num_prompts=20 bench.max_new_tokens=64]

At each batch size the prompts are decoded in consecutive groups of that size; per group every
method runs in turn (prompt i with seed + i), so machine noise hits all alike; wall time is
taken after warm-up with device synchronisation, never CPU time. The batch-1 run also gets
the quality figures (ROUGE-L, perplexity, judge, energy); HF's peers run at batch 1 only.
Warm-up (and compilation) seconds are reported per batch size apart from the timed runs.
Results go to artifacts/<exp>/bench/ (a multirun job writes bench/sweep/<job>-<hash>/, its
overrides inside), and the Pareto plot is redrawn from every results.json of the experiment.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sprinter_train.bench.peers.vllm_peer import VLLM_SD_LEARNED
from sprinter_train.bench.quality.frontier import trace_frontier
from sprinter_train.bench.quality.tau_ladder import hold_taus
from sprinter_train.bench.report.plots import plot_results
from sprinter_train.bench.report.results_md import write_results
from sprinter_train.bench.report.verdicts import check_targets
from sprinter_train.bench.run import provenance
from sprinter_train.bench.run.decode import decode_all
from sprinter_train.bench.run.methods import at_batch_size
from sprinter_train.bench.run.phases import runner_compile_seconds
from sprinter_train.bench.run.prepare import Setup, prepare
from sprinter_train.bench.run.results import input_hashes, summarise_runs
from sprinter_train.core import pidlock
from sprinter_train.core.interrupt import note_completed
from sprinter_train.core.runtime import resolve_device, resolve_dtype, set_threads
from sprinter_train.core.sweeps import job_dir
from sprinter_train.models.loading import ModelLoadError
from sprinter_train.stages import export

log = logging.getLogger(__name__)


def output_dir(cfg: DictConfig) -> Path:
    """bench/ for a single run; bench/sweep/<job>-<hash of its overrides> for each job of a
    Hydra multirun (core/sweeps.py)."""
    return job_dir(Path(cfg.experiment_dir) / "bench")


def tighten_taus(cfg: DictConfig, setup: Setup, results: dict[str, Any]) -> None:
    """Each lossy method past the perplexity bar decoded again, untimed, at the stricter τ of
    `bench.guard.tau_ladder` until one holds it (bench/quality/tau_ladder.py): the batch-1 run's
    prompts and seeds, its policies."""
    guard = cfg.bench.guard
    hold_taus(
        results,
        at_batch_size(setup.plan, cfg, setup.gammas[1]).policies,
        setup.engine,
        setup.models.target.model,
        [p.input_ids for p in setup.prompts],
        [int(cfg.bench.seed) + i for i in range(len(setup.prompts))],
        int(cfg.bench.max_new_tokens),
        list(guard.get("tau_ladder") or []),
        int(guard.nll_batch_size),
    )


def export_predictor(cfg: DictConfig, setup: Setup, out: Path) -> None:
    """vllm_sd_learned's predictor: sd_learned exported by stage=export's own run into this
    bench's output folder (`vllm-export-sd_learned/`), from the verifier and latency profile
    the run uses; where the export fails the method is skipped with the reason."""
    if VLLM_SD_LEARNED not in setup.names:
        return
    folder = out / "vllm-export-sd_learned"
    asked = OmegaConf.merge(cfg, {"export": {"method": "sd_learned", "out_dir": str(folder)}})
    try:
        exported = export.run(asked)  # type: ignore[arg-type]
    except (FileNotFoundError, ValueError, ModelLoadError) as error:
        log.warning(
            "bench: skipping %s: stage=export of sd_learned failed: %s", VLLM_SD_LEARNED, error
        )
        setup.plan.skipped[VLLM_SD_LEARNED] = f"stage=export of sd_learned failed: {error}"
        return
    setup.plan.settings[VLLM_SD_LEARNED]["predictor"] = exported["export_dir"]


def run(cfg: DictConfig) -> dict[str, Any]:
    with pidlock.experiment_writer(cfg.experiment_dir, "bench"):
        return _run(cfg)


def _run(cfg: DictConfig) -> dict[str, Any]:
    set_threads(cfg.get("num_threads"))
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    started = provenance.start(cfg, device, dtype)
    setup = prepare(cfg, device, dtype)
    warmups: dict[int, dict[str, float]] = {}
    out = output_dir(cfg)
    export_predictor(cfg, setup, out)

    def partial(runs_so_far: dict) -> None:
        """The batch sizes done so far, in bench/partial/ (a run stopped later keeps them),
        marked partial in results.json and in results.md's first line, and named in the
        report of an interruption."""
        done = dataclasses.replace(setup, batch_sizes=sorted(runs_so_far))
        results = summarise_runs(cfg, done, runs_so_far, dict(warmups))
        results["partial"] = {
            "batch_sizes_done": done.batch_sizes,
            "batch_sizes": setup.batch_sizes,
        }
        write_results(out / "partial", results)
        note_completed(
            "bench-partial",
            f"batch sizes {done.batch_sizes} of {setup.batch_sizes} measured, in "
            f"{out / 'partial'}/results.json and results.md (marked partial)",
        )
        log.info("bench: batch sizes %s so far in %s", done.batch_sizes, out / "partial")

    runs = decode_all(cfg, setup, warmups, partial)
    results = summarise_runs(cfg, setup, runs, warmups)
    tighten_taus(cfg, setup, results)
    trace_frontier(cfg, setup, results)  # the lossy rules' tokens/s against perplexity
    results["provenance"] = provenance.finish(
        started,
        compile_seconds=runner_compile_seconds(setup.engine)(),
        models=provenance.model_hashes(
            {
                "target": setup.models.target,
                "draft": setup.models.draft,
                "companion": setup.models.companion,
            }
        ),
        **input_hashes(setup.plan),
    )
    b = cfg.bench
    results["targets"] = check_targets(results, OmegaConf.to_container(b.get("targets") or {}))
    write_results(out, results)
    shutil.rmtree(out / "partial", ignore_errors=True)  # complete now (and not another run)
    plot_results(out, Path(cfg.experiment_dir) / "bench")
    log.info("bench: wrote %s", out / "results.md")
    return {"results": str(out / "results.json"), "methods": results["methods"]}
