"""vLLM as a peer of the bench (bench/peers/vllm_peer.py) without vLLM: the request a bench
builds (prompts, sampling, batch sizes, the target's and draft's folders, the predictor), a
result shaped as serving/vllm/run.py writes one parsed into the bench's runs and figures, the
process's environment and failure, the checks that skip a method, and whole tiny benches:
vLLM's process stood in for (its figures reach results.json and results.md) and the
interpreter missing (each vLLM method skipped with the reason). The real runs are
tests/serving/test_vllm_bench.py's (make test-vllm)."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest
import torch

from sprinter_train.__main__ import run_stage
from sprinter_train.bench.peers import vllm_peer
from sprinter_train.bench.peers.vllm_peer import (
    PeerUnavailable,
    add_figures,
    batch_figures,
    build_request,
    num_speculative_tokens,
    parse_result,
    plan_settings,
    run_method,
    vllm_dtype,
    vllm_version,
)
from sprinter_train.bench.report.summary import speed
from sprinter_train.bench.run.methods import method_problems, plan_methods
from sprinter_train.core.io import read_json
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt
from sprinter_train.models import loading

DRAFT = "checkpoints/drafts/smollm2-draft"
COMPANION = "checkpoints/drafts/smollm2-companion"  # a local folder, as a stand-in target
SPECS = {"target": {"path": COMPANION}, "draft": {"path": DRAFT}}
VLLM_CFG = {"python": "/x/python", "num_speculative_tokens": "auto", "dtype": "auto", "runs": 2}


def prompts(count: int = 3) -> list[Prompt]:
    return [
        Prompt(f"p{i}", "test", "test", f"prompt {i}", list(range(10, 14 + i)), None)
        for i in range(count)
    ]


def result_of(spec: bool = True) -> dict[str, Any]:
    """A result as serving/vllm/run.py writes one: 3 prompts at batch sizes 1 and 2, two
    timed runs of each group after the warm-up (groups [0], [1], [2] and [0, 1], [2])."""
    counters = {"num_drafts": 10.0, "num_draft_tokens": 30.0, "num_accepted_tokens": 12.0}
    tokens = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    return {
        "startup_s": 21.5,
        "batches": {
            "1": {
                "tokens": tokens,
                "seconds": [0.3, 0.2, 0.4, 0.5, 0.2, 0.4],  # run 1: groups 0..2, then run 2
                "generated": [3, 2, 4, 3, 2, 4],
                "spec_decode": counters if spec else {},
            },
            "2": {
                "tokens": tokens,
                "seconds": [0.3, 0.2, 0.5, 0.2],
                "generated": [5, 4, 5, 4],
                "spec_decode": {k: v / 2 for k, v in counters.items()} if spec else {},
            },
        },
        "versions": {"vllm": "0.32.0", "torch": "2.13.0+cpu"},
        "threads": 2,
    }


@pytest.fixture
def vllm_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's check passes without starting an interpreter."""
    monkeypatch.setattr(vllm_peer, "vllm_version", lambda python: "0.32.0")


def test_plan_settings_name_the_folders_and_drafts_a_round(vllm_here) -> None:
    sd = plan_settings("vllm_sd", VLLM_CFG, SPECS, sd_gamma=3, compile=False)
    root = loading.REPO_ROOT
    assert sd["target"] == str(root / COMPANION) and sd["draft"] == str(root / DRAFT)
    assert Path(sd["target"]).is_absolute()  # the process runs from the repo root
    assert (sd["num_speculative_tokens"], sd["runs"], sd["predictor"]) == (3, 2, None)
    assert sd["python"] == "/x/python" and sd["vllm_version"] == "0.32.0"
    alone = plan_settings("vllm", VLLM_CFG, SPECS, sd_gamma=3, compile=True)
    assert alone["draft"] is None and alone["num_speculative_tokens"] is None and alone["compile"]
    relative = plan_settings("vllm", {"python": ".venv-vllm/bin/python"}, SPECS, 3, False)
    assert relative["python"] == str(root / ".venv-vllm" / "bin" / "python")
    with pytest.raises(PeerUnavailable, match="local folders"):
        plan_settings("vllm", VLLM_CFG, {"target": {"path": "tiny_random"}}, 3, False)


def test_drafts_a_round_and_dtype_follow_the_bench() -> None:
    assert num_speculative_tokens("auto", 5) == 5
    assert num_speculative_tokens("auto", 0) == vllm_peer.FALLBACK_DRAFTS == 4
    assert num_speculative_tokens(2, 5) == 2
    assert vllm_dtype("auto", torch.float32) == "float32"
    assert vllm_dtype("auto", torch.bfloat16) == "bfloat16"
    assert vllm_dtype("auto", torch.float16) == "bfloat16"  # vLLM's CPU backend: fp32, bf16
    assert vllm_dtype("float32", torch.bfloat16) == "float32"


def test_the_request_carries_the_benchs_prompts_sampling_and_sizes(vllm_here) -> None:
    settings = plan_settings("vllm_sd_learned", VLLM_CFG, SPECS, sd_gamma=3, compile=False)
    settings["predictor"] = "/out/bench/vllm-export-sd_learned"
    request = build_request(
        settings,
        prompts(),
        sampling=SamplingConfig(temperature=0.2, top_k=5, top_p=0.9),
        max_new_tokens=16,
        seed=7,
        batch_sizes=[1, 2],
        stop_token_ids=[2],
        dtype="float32",
    )
    assert request["prompts"] == [[10, 11, 12, 13], [10, 11, 12, 13, 14], [10, 11, 12, 13, 14, 15]]
    assert request["sampling"] == {"temperature": 0.2, "top_p": 0.9, "top_k": 5}
    assert (request["seed"], request["max_new_tokens"], request["batch_sizes"]) == (7, 16, [1, 2])
    assert request["target"] == settings["target"] and request["draft"] == settings["draft"]
    assert request["predictor"] == "/out/bench/vllm-export-sd_learned"
    assert (request["num_speculative_tokens"], request["runs"]) == (3, 2)
    assert request["stop_token_ids"] == [2] and request["dtype"] == "float32"
    assert request["max_model_len"] == 6 + 16 + 3 + 1  # the longest prompt, budget, a round
    assert request["compile"] is False
    json.dumps(request)  # what run.py reads
    alone = build_request(
        plan_settings("vllm", VLLM_CFG, SPECS, 3, False), prompts(1),
        sampling=SamplingConfig(temperature=0.0), max_new_tokens=8, seed=0, batch_sizes=[1],
        stop_token_ids=[], dtype="bfloat16",
    )  # fmt: skip
    assert alone["draft"] is None and alone["predictor"] is None
    assert alone["num_speculative_tokens"] is None and alone["max_model_len"] == 4 + 8 + 1


def test_a_result_becomes_the_benchs_runs_and_vllms_figures() -> None:
    runs, record = parse_result(result_of(), prompts(), [1, 2])
    one, two = runs[1], runs[2]
    assert [[p.prompt_id for p in r.prompts] for r in two] == [["p0", "p1"], ["p2"]]
    assert [r.tokens for r in one] == [[[1, 2, 3]], [[4, 5]], [[6, 7, 8, 9]]]
    assert [r.tokens for r in two] == [[[1, 2, 3], [4, 5]], [[6, 7, 8, 9]]]
    # a group's seconds: the mean of its timed runs (run.py: every group once a run)
    assert [r.wall_s for r in one] == pytest.approx([0.4, 0.2, 0.4])
    assert [r.wall_s for r in two] == pytest.approx([0.4, 0.2])
    assert all(r.joules is None and "vLLM" in str(r.energy_reason) for r in one)
    figures = record["batches"]["1"]
    assert figures["tokens_per_s"] == pytest.approx(18 / 2.0)  # sum generated / sum seconds
    assert speed(one)["tokens_per_s"] == pytest.approx(figures["tokens_per_s"])  # the bench's
    assert figures["acceptance"] == pytest.approx(12 / 30)
    assert figures["drafts_per_round"] == pytest.approx(3.0)
    assert figures["spec_decode"]["num_draft_tokens"] == 30.0
    assert record["batches"]["2"]["tokens_per_s"] == pytest.approx(18 / 1.2)
    assert (record["startup_s"], record["threads"]) == (21.5, 2)
    assert record["versions"]["vllm"] == "0.32.0"
    alone = batch_figures(result_of(spec=False)["batches"]["1"])
    assert alone["acceptance"] is None and alone["drafts_per_round"] is None
    broken = result_of()["batches"]["2"] | {"seconds": [0.1, 0.2, 0.3]}
    with pytest.raises(ValueError, match="3 timed runs for 2 groups"):
        parse_result({**result_of(), "batches": {"2": broken}}, prompts(), [2])


def test_vllms_figures_reach_the_rows_of_every_batch_size() -> None:
    _, record = parse_result(result_of(), prompts(), [1, 2])
    row = {"tokens_per_s": 9.0, "acceptance_rate": None, "target_calls": 0, "draft_calls": 0}
    results = {
        "methods": {"vllm_sd": dict(row), "sd": {"acceptance_rate": 0.5}},
        "batches": {"1": {"methods": {"vllm_sd": dict(row)}}, "2": {"methods": {"vllm_sd": {}}}},
    }
    add_figures(results, {"vllm_sd": {"run": record}, "sd": {}}, {"2": {"vllm_sd": 1}})
    for got in (results["methods"]["vllm_sd"], results["batches"]["1"]["methods"]["vllm_sd"]):
        assert got["acceptance_rate"] == pytest.approx(0.4)
        assert got["vllm"]["startup_s"] == 21.5 and got["vllm"]["drafts_per_round"] == 3.0
        assert got["target_calls"] is None and got["tokens_per_target_call"] is None
    two = results["batches"]["2"]["methods"]["vllm_sd"]
    assert two["vllm"]["acceptance"] == pytest.approx(0.4)
    assert two["outputs_differing_from_target_only"] == 1
    assert results["methods"]["sd"] == {"acceptance_rate": 0.5}  # only vLLM's rows


def script(folder: Path, name: str, body: str) -> str:
    """An executable shell script standing in for an interpreter."""
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_the_process_runs_under_the_benchs_threads_and_fails_with_its_reason(
    tmp_path: Path,
) -> None:
    # argv: -m sprinter_train.serving.vllm.run request.json result.json
    echo = script(
        tmp_path, "echo",
        'printf \'{"omp": "%s", "kv": "%s", "module": "%s"}\' "$OMP_NUM_THREADS" '
        '"$VLLM_CPU_KVCACHE_SPACE" "$2" > "$4"\n',
    )  # fmt: skip
    assert run_method(echo, {"prompts": []}, threads=3, kv_cache_gib=1) == {
        "omp": "3", "kv": "1", "module": vllm_peer.RUNNER,
    }  # fmt: skip
    failing = script(tmp_path, "failing", "echo 'RuntimeError: no CPU backend' >&2; exit 3\n")
    with pytest.raises(PeerUnavailable, match="exited with 3: RuntimeError: no CPU backend"):
        run_method(failing, {}, threads=1)


def test_vllm_is_checked_once_and_its_absence_named(tmp_path: Path) -> None:
    with pytest.raises(PeerUnavailable, match="no vLLM interpreter at .*make vllm-setup"):
        vllm_version(str(tmp_path / "missing" / "python"))
    broken = script(tmp_path, "broken", "echo \"ModuleNotFoundError: No module named 'vllm'\" >&2; exit 1\n")  # fmt: skip
    with pytest.raises(PeerUnavailable, match="`import vllm` fails under .*No module named"):
        vllm_version(broken)
    counted = script(tmp_path, "counted", f"echo run >> {tmp_path / 'calls'}; echo 0.32.0\n")
    assert vllm_version(counted) == vllm_version(counted) == "0.32.0"
    assert (tmp_path / "calls").read_text() == "run\n"  # once a process


def test_the_plan_knows_the_vllm_methods_and_skips_them_without_vllm(compose_cfg) -> None:
    cfg = compose_cfg(
        "stage=bench",
        "bench.methods=[target_only,vllm,vllm_sd,vllm_sd_learned]",
        "bench.vllm.python=/nowhere/python",
    )
    assert method_problems(cfg) == []
    plan = plan_methods(cfg, 3, None, False)
    assert set(plan.skipped) == {"vllm", "vllm_sd", "vllm_sd_learned"}
    assert all("no vLLM interpreter at /nowhere/python" in r for r in plan.skipped.values())
    assert "target_only" in plan.policies and not plan.peers


def test_local_folder_dequantises_a_gguf_once(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    made: list[str] = []

    def dequantise(directory, gguf_file, dtype, cache_root):
        made.append(gguf_file)
        folder = loading._gguf_cache_dir(Path(directory) / gguf_file, cache_root)
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")

    monkeypatch.setattr(loading, "_load_gguf", dequantise)
    spec, cache = {"path": str(tmp_path), "gguf_file": "m.gguf"}, str(tmp_path / "cache")
    first = loading.local_folder(spec, cache)
    assert first.parent == tmp_path / "cache" and (first / "config.json").exists()
    assert loading.local_folder(spec, cache) == first and made == ["m.gguf"]
    assert loading.local_folder({"path": DRAFT}) == loading.REPO_ROOT / DRAFT
    for missing in ({"path": "tiny_random"}, {"path": str(tmp_path / "none")}):
        with pytest.raises(loading.ModelLoadError):
            loading.local_folder(missing)


TINY = [
    "stage=bench",
    "models=tiny_random",
    "experiment=vllm_peer",
    "sampling.temperature=0",
    "num_threads=1",
    "data.max_prompt_tokens=32",
    "bench.num_prompts=3",
    "bench.max_new_tokens=6",
    "bench.batch_sizes=[2]",
    "bench.gamma_max=2",
    "bench.latency.reps=1",
    "bench.judge.enabled=false",
    "bench.law_distance_prompts=0",
    "bench.energy=false",
    "bench.methods=[target_only,vllm,vllm_sd,vllm_sd_learned]",
]


@pytest.mark.heavy  # a whole bench stage
def test_a_bench_without_the_vllm_interpreter_skips_them_with_the_reason(compose_cfg) -> None:
    cfg = compose_cfg(*TINY, "bench.vllm.python=/nowhere/python")
    run_stage(cfg)
    out = Path(cfg.experiment_dir) / "bench"
    results = read_json(out / "results.json")
    assert set(results["skipped"]) == {"vllm", "vllm_sd", "vllm_sd_learned"}
    assert "no vLLM interpreter at /nowhere/python" in results["skipped"]["vllm"]
    assert set(results["methods"]) == {"target_only"}
    text = (out / "results.md").read_text()
    assert "Skipped: vllm: no vLLM interpreter" in text and "## vLLM" not in text


@pytest.mark.heavy  # a whole bench stage
def test_vllms_runs_are_the_benchs_rows_at_every_batch_size(compose_cfg, monkeypatch) -> None:
    """vLLM's process stood in for: what it returns becomes rows beside target_only's at
    batch 1 and 2, vllm_sd_learned (no trained verifier) is skipped naming stage=train."""
    asked: list[dict[str, Any]] = []

    def fake_run(python, request, threads, kv_cache_gib=None):
        asked.append({**request, "threads": threads, "kv": kv_cache_gib})
        size_runs = {}
        for size in request["batch_sizes"]:
            groups = -(-len(request["prompts"]) // size)
            size_runs[str(size)] = {
                "tokens": [[5] * 6 for _ in request["prompts"]],
                "seconds": [0.01] * groups,
                "generated": [6 * min(size, 3 - g * size) for g in range(groups)],
                "spec_decode": {"num_drafts": 4.0, "num_draft_tokens": 8.0,
                                "num_accepted_tokens": 6.0} if request["draft"] else {},
            }  # fmt: skip
        return {"startup_s": 1.5, "batches": size_runs, "versions": {"vllm": "x"}, "threads": 1}

    monkeypatch.setattr(vllm_peer, "vllm_version", lambda python: "x")
    monkeypatch.setattr(vllm_peer, "local_folder", lambda spec, cache=None: Path("/models/m"))
    monkeypatch.setattr(vllm_peer, "run_method", fake_run)
    cfg = compose_cfg(*TINY)
    run_stage(cfg)
    out = Path(cfg.experiment_dir) / "bench"
    results = read_json(out / "results.json")
    assert list(results["skipped"]) == ["vllm_sd_learned"]
    assert "stage=train" in results["skipped"]["vllm_sd_learned"]
    assert [a["draft"] for a in asked] == [None, "/models/m"]
    assert all(a["batch_sizes"] == [1, 2] and a["threads"] == 1 and a["kv"] == 1 for a in asked)
    assert all(a["sampling"]["temperature"] == 0.0 and a["dtype"] == "float32" for a in asked)
    assert list(results["methods"]) == ["target_only", "vllm", "vllm_sd"]  # bench.methods' order
    for size, wall in (("1", 0.03), ("2", 0.02)):
        row = results["batches"][size]["methods"]["vllm_sd"]
        assert row["tokens_per_s"] == pytest.approx(18 / wall) == row["vllm"]["tokens_per_s"]
        assert row["acceptance_rate"] == 0.75 and row["vllm"]["drafts_per_round"] == 2.0
    assert results["batches"]["2"]["unsupported"] == {}  # vLLM runs batches
    assert results["settings"]["vllm_sd"]["run"]["startup_s"] == 1.5
    text = (out / "results.md").read_text()
    assert "## vLLM" in text and "| vllm_sd | 2 |" in text
