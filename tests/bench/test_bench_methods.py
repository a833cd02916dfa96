"""The bench's method plan: policies instantiated from cfg.methods with the run-time objects
they name, skips that name the stage to run, HF's peers from cfg.bench."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sprinter_train.__main__ import run_stage
from sprinter_train.bench.run.methods import MethodPlan, at_batch_size, plan_methods
from sprinter_train.bench.run.prepare import wants_companion
from sprinter_train.bench.timing.latency import LatencyProfile
from sprinter_train.core.config import compose_config
from sprinter_train.decoding.policies.registry import MethodError
from sprinter_train.decoding.timings import Timings
from sprinter_train.models.tiny import build_tiny_model
from sprinter_train.verifier.checkpoint import save_verifier, verifier_path
from sprinter_train.verifier.scorer import CheckpointVerifier
from tests.synthetic import write_synthetic_records

SD_GAMMA = 3  # what the stage would have chosen for `methods.sd.gamma: auto`
PROFILE = LatencyProfile({1: 30.0, 2: 31.0, 3: 33.0}, 3.0, 2.0, 128, "cpu", "float32")
DRAFT = build_tiny_model({}, seed=0)


def plan(cfg, companion: bool = True) -> MethodPlan:
    return plan_methods(cfg, SD_GAMMA, DRAFT, companion)


def test_overrides_of_cfg_methods_reach_the_policies(compose_cfg) -> None:
    cfg = compose_cfg(
        "stage=bench",
        "bench.gamma_max=6",
        "methods.svip.h=0.3",
        "methods.adaedl.lam=0.4",
        "methods.mtad.beam_width=2",
        "methods.sd_heuristic.gamma_init=3",
    )
    result = plan(cfg)
    svip = result.policies["svip"]
    assert (svip.h, svip.c, svip.max_gamma) == (0.3, 0.15, 6)
    assert result.settings["svip"] == {"h": 0.3, "c": 0.15, "max_gamma": 6, "warped_entropy": False}
    assert result.policies["adaedl"].lam == 0.4 and result.policies["adaedl"].gamma == 0.5
    assert result.policies["mtad"].beam_width == 2
    assert result.policies["sd_heuristic"].gamma_init == 3
    assert result.policies["sd"].gamma == SD_GAMMA and result.settings["sd"]["gamma"] == SD_GAMMA
    assert result.settings["target_only"] == {}
    assert result.peers["hf_assisted"] == {"schedule": "constant", "num_assistant_tokens": SD_GAMMA}
    assert result.peers["hf_assisted_heuristic"]["num_assistant_tokens"] == 5
    # hf_static: compile as decoding.compile resolves on the device (auto: off on the CPU)
    assert result.peers["hf_static"] == {"compile": False, "compile_mode": "reduce-overhead"}
    forced = plan(compose_cfg("stage=bench", "decoding.compile=true", "bench.methods=[hf_static]"))
    assert forced.peers["hf_static"]["compile"] is True
    assert at_batch_size(forced, cfg, 2).peers == forced.peers  # no gamma for it to take


def test_bench_methods_selects_what_runs(compose_cfg) -> None:
    result = plan(compose_cfg("stage=bench", "bench.methods=[sd,svip]", "methods.sd.gamma=5"))
    assert set(result.policies) == {"sd", "svip"} and not result.peers and not result.skipped
    assert result.policies["sd"].gamma == 5  # a set gamma is the policy's, not the chosen one
    with pytest.raises(ValueError, match="unknown bench.methods \\['sdd'\\].*svip"):
        plan(compose_cfg("stage=bench", "bench.methods=[sdd]"))


def test_a_config_handing_a_method_an_input_its_traits_do_not_need_is_refused(
    compose_cfg,
) -> None:
    cfg = compose_cfg("stage=bench", "bench.methods=[svip]", "+methods.svip.verifier={lam: 1.2}")
    with pytest.raises(MethodError, match="methods.svip configures verifier .* need only nothing"):
        plan(cfg)


def test_missing_artifacts_skip_a_method_with_the_command_that_makes_them(compose_cfg) -> None:
    result = plan(compose_cfg("stage=bench", "experiment=bare"))
    assert "stage=train experiment=bare train.lam=1.2" in result.skipped["sprinter"]
    assert "stage=tables experiment=bare" in result.skipped["sv"]
    needs_nothing_trained = {
        "target_only",
        "sd",
        "sd_heuristic",
        "svip",
        "adaedl",
        "mtad",
        "typical",
        "oracle",
    }
    assert set(result.policies) == needs_nothing_trained | {"sd_online"}  # it learns as it goes
    without = plan(compose_cfg("stage=bench", "experiment=bare"), companion=False)
    assert "models.companion" in without.skipped["sv"]


def test_sprinter_and_sv_get_the_artifacts_their_configs_name(compose_cfg, tmp_path: Path) -> None:
    cfg = compose_cfg(
        "stage=bench",
        "experiment=syn",
        f"checkpoints_root={tmp_path / 'checkpoints'}",
        "methods.sprinter.verifier.lam=1.5",
    )
    write_synthetic_records(Path(cfg.experiment_dir), rows=2048, d=8, shard_rows=1024)
    run_stage(compose_cfg("stage=tables", "experiment=syn"))
    path = verifier_path(cfg.checkpoint_dir, 1.5)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_verifier(
        path, torch.zeros(8), torch.zeros(1), {"lam": 1.5, "features": {"names": ["hidden"]}}
    )
    result = plan(cfg)
    # sd_learned's verifier-accept: tests/decoding/test_sd_learned.py
    assert set(result.skipped) == {"sd_learned"}
    sprinter = result.policies["sprinter"]
    assert isinstance(sprinter.verifier, CheckpointVerifier) and sprinter.verifier.bias == 0.0
    expected = {"lam": 1.5, "path": str(path), "hidden_layer": -1}  # the layer it reads
    expected |= {"calibration": None, "prior": None}  # an old sidecar: T = 1, no class balance
    assert result.settings["sprinter"]["verifier"] == expected
    sv = result.policies["sv"]
    latency, step_cost = sv.costs(Timings(**PROFILE.priors()))  # the bench's engine's priors
    assert latency(4, 3) == pytest.approx(PROFILE.target_batch_s(4, 3))
    assert step_cost(4) == pytest.approx(PROFILE.draft_step_s(4))
    half = torch.tensor([0.5])
    assert 0.0 <= float(sv.table.lookup(half, half)) <= 1.0
    assert 0.0 <= float(sv.table.lookup_s(half)) <= 1.0
    table = Path(cfg.experiment_dir) / "tables" / "sv_table.json"
    assert result.settings["sv"]["table"] == {"binning": None, "path": str(table)}


def test_the_companion_is_loaded_only_for_a_method_that_reads_it() -> None:
    def wants(methods: str) -> bool:
        return wants_companion(compose_config(f"bench.methods=[{methods}]"))

    assert not wants("target_only,sd,svip,hf_static,hf_assisted")
    assert wants("sd,sv") and wants("sv_paper") and wants("sd_learned")
