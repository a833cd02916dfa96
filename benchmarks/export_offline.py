"""An exported folder on the offline pair: greedy `generate(custom_generate=<folder>)` against
the target's own greedy `generate`, token for token, and their tokens/s side by side.

python benchmarks/export_offline.py --folder checkpoints/demo/export-sd_learned
python benchmarks/export_offline.py --folder <folder> --flat-verify   # make sd_learned draft

Runs as a user would: the folder through transformers' string form with `trust_remote_code`
and `assistant_model=draft` (and `companion_model=` when the export names a companion), in
float32 so that greedy speculative decoding must equal greedy target decoding exactly. The
prompts are the first of the ShareGPT test split. The last line is `equal=<k>/<n>`; the exit
status is 1 when any output differs.

On a CPU without native bf16 a verify over k tokens costs about k single steps, so the folder's
latency profile tells sd_learned that no draft pays and every round is target-only: equality
is then no test of the speculative path. `--flat-verify` passes the folder's profile with every
verify width priced as one token (as a GPU or a bf16 CPU prices them), a documented override
of the folder's settings, so rounds draft and the draft's tokens meet the target's check.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import transformers

from sprinter_train.core.config import compose_config
from sprinter_train.core.runtime import set_threads
from sprinter_train.data.prompts import load_prompts
from sprinter_train.models.roles import load_roles


def flat_verify(profile: dict) -> dict:
    """`profile` with the target's forward over n tokens priced as over one, at every size."""
    flat = {**profile, "target_ms": dict.fromkeys(profile["target_ms"], profile["target_ms"]["1"])}
    flat["batch_target_ms"] = {
        size: dict.fromkeys(table, table["1"])
        for size, table in (profile.get("batch_target_ms") or {}).items()
    }
    return flat


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True, help="an export-<method> folder")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument(
        "--flat-verify", action="store_true", help="price every verify width as one token"
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (models=..., data=...)")
    args = parser.parse_args()
    cfg = compose_config("device=cpu", "dtype=float32", *args.overrides)
    threads = set_threads(cfg.get("num_threads"))
    export = json.loads((Path(args.folder) / "export.json").read_text())
    models = load_roles(cfg.models, torch.device("cpu"), torch.float32)
    target, draft = models.target.model, models.draft.model
    extra: dict = {}
    if args.flat_verify:
        extra["latency"] = flat_verify(json.loads((Path(args.folder) / "latency.json").read_text()))
    if export.get("models", {}).get("companion") and models.companion is not None:
        extra["companion_model"] = models.companion.model
    data = {**dict(cfg.data), "num_prompts": args.prompts}
    prompts = load_prompts(data, models.tokenizer, split="test")[: args.prompts]
    rows, equal = [], 0
    for prompt in prompts:
        ids = torch.tensor([prompt.input_ids])
        plain = dict(max_new_tokens=args.new_tokens, do_sample=False)
        start = time.perf_counter()
        own = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **plain)
        own_s = time.perf_counter() - start
        start = time.perf_counter()
        out = target.generate(
            input_ids=ids,
            custom_generate=str(args.folder),
            trust_remote_code=True,
            assistant_model=draft,
            return_dict_in_generate=True,
            **extra,
            **plain,
        )
        folder_s = time.perf_counter() - start
        mine, theirs = out.sequences[0].tolist(), own[0].tolist()
        same = mine == theirs
        equal += same
        new = len(theirs) - len(prompt.input_ids)
        rows.append(
            {
                "prompt_id": prompt.prompt_id,
                "new_tokens": new,
                "equal": same,
                "target_generate_tok_s": new / own_s,
                "folder_tok_s": (len(mine) - len(prompt.input_ids)) / folder_s,
                "stats": out.stats,
            }
        )
        print(
            f"{prompt.prompt_id}: {new} tokens, equal={same}, target generate "
            f"{new / own_s:.1f} tok/s, folder {rows[-1]['folder_tok_s']:.1f} tok/s, {out.stats}"
        )
    result = {
        "folder": str(args.folder),
        "method": export.get("method"),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "threads": threads,
        "flat_verify": args.flat_verify,
        "dtype": "float32",
        "prompts": rows,
        "equal": equal,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"transformers={transformers.__version__} equal={equal}/{len(rows)}")
    return 0 if equal == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
