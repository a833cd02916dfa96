"""How much of SPRINTER's label can the draft's own features predict, linear or not?

python benchmarks/verifier_ceiling.py --experiment sg1600

The λ = 1.2 verifier is a linear probe on the draft's hidden state. When its AUC is short of
SPRINTER's 0.8-0.9, this tells apart three reasons on the same records: the training (a
tuned L2 logistic regression on the same features), the inputs (adding q(x), H(q) and the
draft's embedding of x, SPRINTER §3.2's other suggested features) and the linear form (an
MLP on all of them). Every model is fitted on the train split, its regularisation chosen on
val, and scored on test against q/p <= 1 (the label of the issue's AUC bar).
Writes artifacts/<exp>/eval/ceiling.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

from sprinter_train.config import compose_config
from sprinter_train.evaluation.classification import auc
from sprinter_train.recordset import open_records
from sprinter_train.verifier.features import DraftEmbedder


def fit_scored(make, grid, x, y, split, y_eval) -> dict[str, Any]:
    """Fit one model per grid value on train; keep the best val AUC; report its test AUC."""
    scaler = StandardScaler().fit(x[split == "train"])
    z = {s: scaler.transform(x[split == s]) for s in ("train", "val", "test")}
    best: dict[str, Any] = {}
    for value in grid:
        start = time.perf_counter()
        model = make(value).fit(z["train"], y[split == "train"])
        score = {s: model.predict_proba(z[s])[:, 1] for s in ("val", "test")}
        val = auc(y_eval[split == "val"], score["val"])
        if not best or (val or 0) > best["val_auc"]:
            best = {
                "setting": value,
                "val_auc": val,
                "test_auc": auc(y_eval[split == "test"], score["test"]),
                "seconds": round(time.perf_counter() - start, 1),
            }
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--lam", type=float, default=1.2, help="the training label q/p <= λ")
    parser.add_argument("--overrides", nargs="*", default=[], help="extra Hydra overrides")
    args = parser.parse_args()
    cfg = compose_config("stage=evaluate", f"experiment={args.experiment}", *args.overrides)
    columns = ["split", "ratio", "q", "draft_entropy", "token_id", "prompt_id"]
    records = open_records(cfg.experiment_dir, columns=columns)
    frame = records.frame
    split = frame["split"].to_numpy()
    ratio = frame["ratio"].to_numpy()
    y, y_eval = ratio <= args.lam, ratio <= 1.0
    hidden = records.hidden(np.arange(len(frame))).astype(np.float32)
    scalars = frame[["q", "draft_entropy"]].to_numpy(np.float32)
    spec = OmegaConf.to_container(cfg.models.draft, resolve=True)
    embedding = DraftEmbedder(spec, cfg.models.get("cache_dir"))(frame["token_id"].to_numpy())
    everything = np.hstack([hidden, scalars, embedding.astype(np.float32)])

    def logistic(c):
        return LogisticRegression(C=c, max_iter=3000)

    def mlp(alpha):
        return MLPClassifier((256,), alpha=alpha, early_stopping=True, max_iter=200, random_state=0)

    c_grid = [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 1e-1]
    rows = {
        "draft_q alone": {"test_auc": auc(y_eval[split == "test"], scalars[split == "test", 0])},
        "linear: hidden (the paper's verifier, L2 on val)": fit_scored(
            logistic, c_grid, hidden, y, split, y_eval
        ),
        "linear: hidden + q + H(q)": fit_scored(
            logistic, c_grid, np.hstack([hidden, scalars]), y, split, y_eval
        ),
        "linear: hidden + q + H(q) + embedding of x": fit_scored(
            logistic, c_grid, everything, y, split, y_eval
        ),
        "MLP (256): hidden + q + H(q) + embedding of x": fit_scored(
            mlp, [1e-3, 1e-1, 1.0], everything, y, split, y_eval
        ),
    }
    out = {
        "experiment": args.experiment,
        "lam": args.lam,
        "rows": {s: int((split == s).sum()) for s in ("train", "val", "test")},
        "test_prompts": int(frame["prompt_id"][split == "test"].nunique()),
        "models": rows,
    }
    path = Path(cfg.experiment_dir) / "eval" / "ceiling.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"{out['rows']} records, {out['test_prompts']} test prompts -> {path}")
    print("| model | setting | val AUC | test AUC (q/p <= 1) |\n|---|---|---|---|")
    for name, row in rows.items():
        print(
            f"| {name} | {row.get('setting', '')} | {row.get('val_auc') or '':.4} "
            f"| {row['test_auc']:.4f} |"
            if row.get("val_auc")
            else f"| {name} | | | {row['test_auc']:.4f} |"
        )


if __name__ == "__main__":
    main()
