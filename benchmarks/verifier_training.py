"""How long does stage=train take per λ on a million records?

The figures and their machine: docs/results/verifier-training-time.md.

python benchmarks/verifier_training.py                       # 1M synthetic records, d = 576
python benchmarks/verifier_training.py --rows 100000 --lams 1.2

Writes a synthetic record set in the harvest's format (a known separating direction, see
tests/synthetic.py) under --dir (kept for reruns), then times the real training path
per λ: reading the hidden states, Lightning fit with early stopping, scoring val/test, export.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.synthetic: test data

from sprinter_train.core.config import compose_config
from sprinter_train.harvest.reader import open_records
from sprinter_train.verifier.train import train_verifier
from tests.synthetic import write_synthetic_records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=576)
    parser.add_argument("--lams", type=float, nargs="+", default=[1.0, 1.2, 1.5])
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "verifier_bench")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--overrides", nargs="*", default=[], help="extra Hydra overrides")
    parser.add_argument("--clean", action="store_true", help="delete the record set afterwards")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    experiment = f"synthetic-{args.rows}-{args.d}"
    exp_dir = args.dir / "artifacts" / experiment
    start = time.perf_counter()
    if not (exp_dir / "records" / "manifest.json").exists():
        write_synthetic_records(exp_dir, rows=args.rows, d=args.d)
    print(f"records ready in {time.perf_counter() - start:.1f} s: {exp_dir}")

    cfg = compose_config(
        "stage=train",
        f"experiment={experiment}",
        f"artifacts_root={args.dir / 'artifacts'}",
        f"checkpoints_root={args.dir / 'checkpoints'}",
        "device=cpu",
        *args.overrides,
    )
    start = time.perf_counter()
    records = open_records(cfg.experiment_dir, columns=["split", "ratio", "prompt_id"])
    print(f"record columns read in {time.perf_counter() - start:.1f} s ({len(records.frame)} rows)")
    results = {}
    for lam in args.lams:
        start = time.perf_counter()
        metrics = train_verifier(cfg, records, lam)
        seconds = time.perf_counter() - start
        curve = metrics.get("learning_curve") or []
        results[f"{lam:g}"] = {
            "seconds": round(seconds, 1),
            "fit_seconds": round(metrics["fit_seconds"], 1),
            "learning_curve_seconds": round(sum(p["fit_seconds"] for p in curve[:-1]), 1),
            "epochs": metrics["epochs_run"],
            "val_auc": round(metrics["val"]["auc_label_lam"], 4),
            "test_auc_q_le_p": round(metrics["test"]["auc_q_le_p"], 4),
        }
        print(
            f"lam={lam:g}: {seconds:.1f} s per λ, of which the fit {metrics['fit_seconds']:.1f} s "
            f"({metrics['epochs_run']} epochs)",
            flush=True,
        )
    print(
        json.dumps(
            {"rows": args.rows, "d": args.d, "threads": torch.get_num_threads(), "per_lam": results}
        )
    )
    if args.clean:
        shutil.rmtree(args.dir)


if __name__ == "__main__":
    main()
