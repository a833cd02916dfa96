"""vLLM as a peer in `stage=bench` (make test-vllm; skipped without vLLM): experiment t5's
trained sd_learned verifier, the offline pair in float32, 2 test prompts x 16 tokens at batch
size 1, greedy. `vllm`, `vllm_sd` and `vllm_sd_learned` (its predictor exported by the bench
into its own output folder) each run in a process of their own, get tokens/s > 0 and emit
target_only's tokens.

t5's verifier was fitted at T 0.2; the bench refuses a verifier of other sampling, so the
test benches a copy whose sidecar names no sampling (the weights are t5's): greedy is what
makes the tokens comparable, and a length rule keeps the target's tokens whatever its scores.
Nothing is written under artifacts/t5 or checkpoints/t5.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sprinter_train.__main__ import run_stage
from sprinter_train.bench.peers.vllm_peer import VLLM_NAMES
from sprinter_train.core.config import compose_config
from sprinter_train.core.io import read_json

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.heavy,
]  # heavy: a whole bench stage, three vLLM processes
pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]
T5_CHECKPOINTS = ROOT / "checkpoints" / "t5"
VERIFIER = "verifier-accept"  # methods.sd_learned's (label: accept_prob)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not (T5_CHECKPOINTS / f"{VERIFIER}.safetensors").exists():
        pytest.skip("experiment t5 has no trained verifier here (checkpoints/t5)")
    root = tmp_path_factory.mktemp("vllm_bench")
    checkpoints = root / "checkpoints" / "t5"
    checkpoints.mkdir(parents=True)
    shutil.copy(T5_CHECKPOINTS / f"{VERIFIER}.safetensors", checkpoints)
    sidecar = json.loads((T5_CHECKPOINTS / f"{VERIFIER}.json").read_text())
    sidecar.pop("sampling", None)  # fitted at T 0.2; benched greedy (the docstring says why)
    (checkpoints / f"{VERIFIER}.json").write_text(json.dumps(sidecar))
    cfg = compose_config(
        "stage=bench",
        "experiment=t5",
        f"artifacts_root={root / 'artifacts'}",
        f"checkpoints_root={root / 'checkpoints'}",
        "models=offline_default",
        "models.companion=null",
        "device=cpu",
        "dtype=float32",
        "sampling.temperature=0",
        "bench.methods=[target_only,vllm,vllm_sd,vllm_sd_learned]",
        "bench.num_prompts=2",
        "bench.max_new_tokens=16",
        "bench.batch_sizes=[1]",
        "bench.gamma_max=4",
        "methods.sd.gamma=3",  # vLLM's drafts a round (bench.vllm.num_speculative_tokens: auto)
        "bench.latency.reps=1",
        "bench.warmup_runs=1",
        "bench.min_timed_runs=1",
        "bench.law_distance_prompts=0",
        "bench.judge.enabled=false",
        "bench.energy=false",
        "bench.frontier.enabled=false",
    )
    run_stage(cfg)
    out = Path(cfg.experiment_dir) / "bench"
    return {"results": read_json(out / "results.json"), "out": out}


def test_each_vllm_method_runs_and_keeps_target_onlys_tokens(bench) -> None:
    results = bench["results"]
    assert not results["skipped"], results["skipped"]
    methods, batch = results["methods"], results["batches"]["1"]["methods"]
    for name in VLLM_NAMES:
        assert methods[name]["tokens_per_s"] > 0, name
        assert methods[name]["tokens"] == methods["target_only"]["tokens"], name
        assert methods[name]["outputs_differing_from_target_only"] == 0, name
        assert batch[name]["vllm"]["tokens_per_s"] == pytest.approx(batch[name]["tokens_per_s"])
        assert batch[name]["vllm"]["startup_s"] > 0, name
    settings = results["settings"]
    assert settings["vllm_sd"]["num_speculative_tokens"] == 3
    assert methods["vllm_sd"]["vllm"]["spec_decode"]["num_draft_tokens"] > 0
    assert 0 <= methods["vllm_sd"]["acceptance_rate"] <= 1
    predictor = Path(settings["vllm_sd_learned"]["predictor"])
    assert predictor.parent == bench["out"] and (predictor / "export.json").exists()
    text = (bench["out"] / "results.md").read_text()
    assert "## vLLM" in text and "| vllm_sd_learned | 1 |" in text
