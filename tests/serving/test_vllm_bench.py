"""vLLM as a peer in `stage=bench` (make test-vllm; skipped without vLLM): an sd_learned
verifier on the offline draft (tests/serving/vllm_helpers.py: seeded weights over the trained
verifier's features, its sidecar naming no sampling, so the bench takes it greedy), the offline
pair in float32, 2 test prompts x 16 tokens at batch size 1, greedy. `vllm`, `vllm_sd` and
`vllm_sd_learned` (its predictor exported by the bench into its own output folder) each run
in a process of their own, get tokens/s > 0 and emit target_only's tokens (a length rule keeps
the target's tokens whatever its scores). Everything is written under the test's tmp folder,
so it runs on a fresh clone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sprinter_train.__main__ import run_stage
from sprinter_train.bench.peers.vllm_peer import VLLM_NAMES
from sprinter_train.core.config import compose_config
from sprinter_train.core.io import read_json
from sprinter_train.verifier.checkpoint import verifier_path
from sprinter_train.verifier.labels import Label
from tests.serving.vllm_helpers import write_verifier

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.heavy,
]  # heavy: a whole bench stage, three vLLM processes
pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("vllm_bench")
    write_verifier(verifier_path(root / "checkpoints" / "vllm_bench", Label("accept_prob")))
    cfg = compose_config(
        "stage=bench",
        "experiment=vllm_bench",
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
