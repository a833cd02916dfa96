"""Fault injection on tiny models: killed writers, signals, bad settings, broken files and
logits each end in one clear error (or exit code) instead of garbage or a false success."""

from __future__ import annotations

import json
import math
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from sprinter_train.__main__ import run_stage
from sprinter_train.core import pidlock
from sprinter_train.core.interrupt import StageInterrupted, interruptible, note_completed
from sprinter_train.core.io import CorruptInputError, read_json, write_json
from sprinter_train.core.processes import pid_alive, start_time
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.core.validation import ConfigError
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.builder import build_engine, build_runner
from sprinter_train.decoding.policies import SpeculativeDecoding, TargetOnly
from sprinter_train.distill.trainer import DistillState, load_checkpoint, save_checkpoint
from sprinter_train.harvest.continuations import HarvestSequence
from sprinter_train.harvest.reader import open_records
from sprinter_train.harvest.records import harvest_batch
from sprinter_train.models.loading import VocabularyError, load_model
from sprinter_train.models.roles import Roles
from sprinter_train.models.tiny import build_tiny_model
from sprinter_train.stages import train as train_stage
from sprinter_train.stages.settings import config_problems
from sprinter_train.sv.table import SVTable, TableMismatchError, check_table_models, sealed
from sprinter_train.verifier.checkpoint import load_verifier, save_verifier, verifier_path
from tests.decoding_helpers import PACK_EVERY, FixedLogits
from tests.distill_helpers import TINY_DISTILL
from tests.synthetic import SYNTHETIC_FEATURES, write_synthetic_records

REPO = Path(__file__).resolve().parents[1]
NAN = float("nan")


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        time.sleep(0.1)


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def cli(tmp_path: Path, *overrides: str) -> subprocess.Popen:
    """`python -m sprinter_train` as a user runs it, artifacts and Hydra outputs under tmp_path,
    its output in tmp_path/cli.log (a file: a pipe nobody reads could stall it)."""
    command = [
        sys.executable,
        "-m",
        "sprinter_train",
        f"artifacts_root={tmp_path / 'artifacts'}",
        f"checkpoints_root={tmp_path / 'checkpoints'}",
        f"hydra.run.dir={tmp_path / 'outputs'}",
        "device=cpu",
        "dtype=float32",
        "num_threads=1",
        *overrides,
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    with open(tmp_path / "cli.log", "w") as log:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


# -- 3. leftovers of killed writers --------------------------------------------------------


def test_distill_sweeps_what_killed_writers_left_and_spares_live_ones(
    compose_cfg, tmp_path: Path, sleeper
) -> None:
    work = tmp_path / "artifacts" / "default" / "distill"
    dead, live = dead_pid(), sleeper.pid
    planted = {
        work / "draft" / f".state.pt.tmp{dead}": False,
        work / "teacher" / f".train-00000-top8.npz.tmp{dead}": False,
        work / "corpus" / f".train-00001.npz.tmp{dead}": False,
        work / "teacher" / f".train-00001-top8.npz.tmp{live}": True,  # a live writer's
    }
    for path in planted:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 64)
    lock = work / "distill.lock"  # a SIGKILLed run's lock: stale, taken over
    write_json(lock, {"host": socket.gethostname(), "processes": [{"pid": dead, "started": None}]})
    cfg = compose_cfg(
        "stage=distill",
        *TINY_DISTILL,
        "distill.max_tokens=256",
        "distill.export=false",
        "distill.teacher.background=false",
    )
    assert run_stage(cfg)["tokens"] == 256
    assert {path: path.exists() for path in planted} == planted
    assert not lock.exists()  # released by the run that took it over


# -- 4. signals: exit 128 + signal, never a false success -----------------------------------


@pytest.mark.heavy
def test_sigterm_during_training_exits_143_and_reports_no_success(tmp_path: Path) -> None:
    write_synthetic_records(tmp_path / "artifacts" / "syn", rows=4000, d=16, shard_rows=4096)
    run = cli(
        tmp_path,
        "stage=train",
        "experiment=syn",
        "train.lam=1",
        "train.max_epochs=100000",
        "train.patience=100000",
        "train.learning_curve=[]",
        SYNTHETIC_FEATURES,
    )
    try:
        # Lightning writes hparams.yaml once fit has begun
        started = tmp_path / "artifacts" / "syn" / "train" / "lam1" / "hparams.yaml"
        wait_for(lambda: started.exists() or run.poll() is not None, 120, "training to start")
        time.sleep(0.5)
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=60)
    finally:
        run.kill()
    output = (tmp_path / "cli.log").read_text()
    assert run.returncode == 143, output[-3000:]
    assert "interrupted by SIGTERM" in output
    assert '"verifier_lam1"' not in output  # the success summary is never printed
    assert not verifier_path(tmp_path / "checkpoints" / "syn", 1.0).exists()


def test_stage_all_stops_at_an_interrupted_step_and_names_what_it_finished(
    compose_cfg, monkeypatch
) -> None:
    ran = []

    def train_then_sigterm(cfg) -> dict:
        note_completed("verifier 1", "verifier λ=1 (v1.safetensors)")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this returns
        ran.append("after the signal")
        return {}

    monkeypatch.setattr(train_stage, "run", train_then_sigterm)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(StageInterrupted) as stop:
        run_stage(compose_cfg("stage=all", "all_steps=[train,tables]"))
    assert stop.value.exit_code == 143 and not ran
    assert stop.value.completed == ["verifier λ=1 (v1.safetensors)"]
    assert "stage=all was interrupted by SIGTERM" in stop.value.report()
    assert signal.getsignal(signal.SIGTERM) == before  # the stage's handlers are gone


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_lightning_and_keyboard_interrupts_are_not_successes(
    compose_cfg, monkeypatch, signum
) -> None:
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    def interrupted(cfg) -> dict:
        raise SIGTERMException() if signum == signal.SIGTERM else KeyboardInterrupt()

    monkeypatch.setattr(train_stage, "run", interrupted)
    with pytest.raises(StageInterrupted) as stop:
        run_stage(compose_cfg("stage=train"))
    assert stop.value.exit_code == 128 + signum  # 143 or 130, not Lightning's 0 or 1


def test_a_signal_landing_where_python_drops_exceptions_still_stops_the_stage() -> None:
    """Python runs the handler wherever the main thread is; inside a weakref callback (as in
    torch's compile, on the H200 lease) the raise is printed and dropped, so it must come
    again rather than leave the stage running until a SIGKILL."""

    class Held:
        pass

    began = time.monotonic()
    with pytest.raises(StageInterrupted) as stop, interruptible("stage=bench"):
        held = Held()
        watch = weakref.ref(held, lambda _: os.kill(os.getpid(), signal.SIGTERM))
        del held  # the callback runs here, and the handler raises inside it
        while time.monotonic() - began < 10:  # the stage's own work
            time.sleep(0.01)
    assert watch() is None and stop.value.exit_code == 143
    assert time.monotonic() - began < 5


# -- 5. the background teacher dies with its distill run --------------------------------------


@pytest.mark.heavy
def test_a_sigkilled_distill_leaves_no_live_teacher(tmp_path: Path) -> None:
    lock = tmp_path / "artifacts" / "default" / "distill" / "distill.lock"
    run = cli(
        tmp_path,
        "stage=distill",
        *TINY_DISTILL,
        # a teacher with minutes of work ahead of it, were it left running
        "+models.target.config.hidden_size=256",
        "+models.target.config.intermediate_size=2048",
        "distill.corpus.seq_len=128",
        "distill.corpus.shard_sequences=64",
        "distill.corpus.max_tokens=327680",
        f"distill.output_dir={tmp_path / 'draft'}",
    )
    teacher = None
    try:
        wait_for(
            lambda: (
                len((pidlock.read_lock(lock) or {}).get("processes", [])) == 2
                or run.poll() is not None
            ),
            120,
            "the teacher to start",
        )
        assert run.poll() is None, (tmp_path / "cli.log").read_text()[-3000:]
        teacher = pidlock.read_lock(lock)["processes"][1]["pid"]
        assert pid_alive(teacher)
        run.send_signal(signal.SIGKILL)
        run.wait()
        wait_for(lambda: not pid_alive(teacher), 15, f"teacher {teacher} to die with its parent")
    finally:
        run.kill()
        run.wait()
        if teacher is not None and pid_alive(teacher):
            os.kill(teacher, signal.SIGKILL)


def test_a_second_distill_on_a_busy_work_dir_is_refused(compose_cfg, tmp_path, sleeper) -> None:
    work = tmp_path / "artifacts" / "default" / "distill"
    lock = work / "distill.lock"
    entry = {"pid": sleeper.pid, "started": start_time(sleeper.pid)}
    write_json(lock, {"host": socket.gethostname(), "processes": [entry]})
    with pytest.raises(pidlock.LockHeldError, match=f"in use by process {sleeper.pid}"):
        run_stage(compose_cfg("stage=distill", *TINY_DISTILL))
    assert sorted(p.name for p in work.iterdir()) == ["distill.lock"]  # nothing started
    assert json.loads(lock.read_text())["processes"] == [entry]


def test_a_lock_outlives_its_holder_only_while_a_helper_runs(tmp_path, sleeper) -> None:
    lock = tmp_path / "x.lock"
    pidlock.acquire(lock, "x")
    pidlock.add_process(lock, sleeper.pid)
    payload = pidlock.read_lock(lock)
    payload["processes"][0] = {"pid": dead_pid(), "started": None}  # the holder was killed
    lock.write_text(json.dumps(payload))
    with pytest.raises(pidlock.LockHeldError, match=str(sleeper.pid)):
        pidlock.acquire(lock, "x")  # its helper still runs
    sleeper.kill()
    sleeper.wait()
    pidlock.acquire(lock, "x")  # now every process it names is gone
    assert pidlock.read_lock(lock)["processes"][0]["pid"] == os.getpid()
    pidlock.release(lock)
    assert not lock.exists()


# -- 6. bad settings: one error naming the key, nothing written -------------------------------


@pytest.mark.parametrize(
    ("setting", "key", "allowed"),
    [
        ("sampling.temperature=-0.5", "sampling.temperature", ">= 0"),
        ("sampling.top_p=0", "sampling.top_p", "> 0 and <= 1"),
        ("sampling.top_p=2", "sampling.top_p", "> 0 and <= 1"),
        ("sampling.top_k=-1", "sampling.top_k", ">= 0"),
        ("train.lam=0", "train.lam", "> 0"),
        ("train.lam=-1.2", "train.lam", "> 0"),
        ("train.lam=nan", "train.lam", "finite"),
        ("train.lam=inf", "train.lam", "finite"),
        ("train.lams=[]", "train.lams", "non-empty"),
        ("train.lam=1e-9", "train.lam", "train.lam_range [0.5, 10]"),
        ("train.lams=[1,20]", "train.lams[1]", "train.lam_range [0.5, 10]"),
        ("evaluate.lams=[0.1]", "evaluate.lams[0]", "train.lam_range"),
        ("methods.sprinter.verifier.lam=1e-9", "methods.sprinter.verifier.lam", "lam_range"),
        ("data.max_prompt_tokens=-5", "data.max_prompt_tokens", ">= 0"),
        ("harvest.statistics_rows=0", "harvest.statistics_rows", ">= 1"),
        ("harvest.generation_batch_size=2.5", "harvest.generation_batch_size", "an integer"),
        ("decoding.pack_every=0", "decoding.pack_every", ">= 1"),
        ("decoding.compile=maybe", "decoding.compile='maybe'", "true or false"),
        ("bench.max_new_tokens=0", "bench.max_new_tokens", ">= 1"),
        ("bench.num_prompts=0", "bench.num_prompts", ">= 1"),
        ("bench.batch_sizes=[1,0]", "bench.batch_sizes[1]", ">= 1"),
        ("bench.batch_sizes=[-2]", "bench.batch_sizes[0]", ">= 1"),
        ("bench.methods=[target_only,sd,sd]", "bench.methods names sd", "more than once"),
        ("bench.methods=[target_only,spd]", "unknown method 'spd'", "choose from"),
        ("experiment=", "experiment=''", "non-empty folder name"),
        ("experiment=a/b", "experiment='a/b'", "without path separators"),
    ],
)
def test_a_bad_setting_is_one_error_naming_it_and_nothing_is_written(
    compose_cfg, tmp_path: Path, setting: str, key: str, allowed: str
) -> None:
    cfg = compose_cfg(
        "stage=all",
        "models=tiny_random",
        "data.num_prompts=2",
        f"checkpoints_root={tmp_path / 'checkpoints'}",
        setting,
    )
    with pytest.raises(ConfigError) as error:
        run_stage(cfg)
    lines = str(error.value).splitlines()[1:]
    assert len(lines) == 1 and key in lines[0] and allowed in lines[0]
    assert not (tmp_path / "artifacts").exists() and not (tmp_path / "checkpoints").exists()


def test_the_shipped_settings_and_edge_values_pass_validation(compose_cfg) -> None:
    assert config_problems(compose_cfg("stage=all")) == []
    edges = ["sampling.temperature=0", "sampling.top_p=1", "train.lams=[]", "train.lam=1.5"]
    assert config_problems(compose_cfg("stage=all", *edges)) == []  # lams unused beside lam


def test_a_model_context_too_short_for_the_region_stops_the_harvest(compose_cfg) -> None:
    cfg = compose_cfg(
        "stage=harvest",
        "models=tiny_random",
        "data.num_prompts=2",
        "+models.target.config.max_position_embeddings=24",
        "harvest.continuation_tokens=32",
    )
    with pytest.raises(ConfigError, match="target model's context holds 24 positions.*reserves 32"):
        run_stage(cfg)
    assert not (Path(cfg.experiment_dir) / "records").exists()


# -- 7. non-finite logits --------------------------------------------------------------------

PROMPT = [1, 0, 1, 1]


def fixed_engine(target: list[float], draft: list[float] | None, sampling: SamplingConfig):
    runner = build_runner(FixedLogits(draft), 2) if draft is not None else None
    return build_engine(
        build_runner(FixedLogits(target), 2), sampling, 2, draft=runner, pack_every=PACK_EVERY
    )


def test_greedy_decoding_stops_on_nan_target_logits() -> None:
    engine = fixed_engine([NAN, 0.0], None, SamplingConfig(temperature=0))
    with pytest.raises(FloatingPointError, match="target model's logits .* at position 3"):
        engine.generate([PROMPT], TargetOnly(), 4)


def test_sampling_stops_on_infinite_draft_logits() -> None:
    engine = fixed_engine([0.0, 0.0], [math.inf, 0.0], SamplingConfig(temperature=1.0))
    with pytest.raises(FloatingPointError, match="draft model's logits .* at position 1"):
        engine.generate([PROMPT, PROMPT[:2]], SpeculativeDecoding(gamma=2), 4)  # lowest: row 2


def test_minus_infinity_alone_is_a_token_never_emitted_not_an_error() -> None:
    engine = fixed_engine([0.0, 0.0], [0.0, -math.inf], SamplingConfig(temperature=1.0))
    result = engine.generate([PROMPT], SpeculativeDecoding(gamma=2), 6)[0]
    assert len(result.tokens) == 6


def test_a_harvest_batch_stops_on_nan_logits_naming_the_model_and_prompt() -> None:
    cpu = torch.device("cpu")
    target = load_model({"path": "tiny_random", "seed": 1}, "target", cpu, torch.float32)
    draft = load_model({"path": "tiny_random", "seed": 2}, "draft", cpu, torch.float32)
    draft.model.lm_head.weight.data[5] = NAN
    models = Roles(draft, target, None, 128, 2)
    prompt = Prompt("p-7", "tiny", "train", "abc", [1, 5, 6, 7], None)
    sequence = HarvestSequence(prompt, "original", [1, 5, 6, 7, 8, 9], 4, 6)
    with pytest.raises(FloatingPointError, match="draft model.*prompt p-7's token at position 4"):
        harvest_batch(models, [sequence], SamplingConfig(), -1, 0, cpu)


# -- 8. broken files are named, with the stage that rewrites them ------------------------------


@pytest.fixture
def records(tmp_path: Path) -> Path:
    write_synthetic_records(tmp_path / "artifacts" / "syn", rows=200, d=8, shard_rows=128)
    return tmp_path / "artifacts" / "syn" / "records"


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garble_head(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:16] = b"\x93NUMPY\x01\x00garbage"[:16].ljust(16, b"!")
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [truncate, garble_head], ids=["truncated", "garbled"])
def test_a_broken_hidden_file_names_itself_and_stage_harvest(compose_cfg, records, damage) -> None:
    hidden = records / "shard-000001.hidden.npy"
    damage(hidden)
    with pytest.raises(CorruptInputError, match=f"{hidden.name}.*stage=harvest"):
        run_stage(compose_cfg("stage=train", "experiment=syn"))


def test_a_broken_manifest_names_itself_and_stage_harvest(records) -> None:
    manifest = records / "manifest.json"
    truncate(manifest)
    with pytest.raises(CorruptInputError, match="manifest.json.*stage=harvest"):
        open_records(records.parent)
    manifest.write_text("[1, 2]")
    with pytest.raises(CorruptInputError, match="manifest.json.*stage=harvest"):
        open_records(records.parent)


def test_a_manifest_listing_a_shard_twice_is_refused(records) -> None:
    """Every row of the shard would be read twice (exit 0, doubled counts)."""
    manifest = records / "manifest.json"
    payload = read_json(manifest)
    payload["shards"].append(payload["shards"][0])
    write_json(manifest, payload)
    first = payload["shards"][0]["name"]
    with pytest.raises(CorruptInputError, match=f"shard {first} listed more than once"):
        open_records(records.parent)


@pytest.fixture
def verifier(tmp_path: Path) -> Path:
    meta = {"lam": 1.0, "features": {"names": ["hidden"], "d_in": 8}}
    return save_verifier(verifier_path(tmp_path, 1.0), torch.ones(8), torch.zeros(1), meta)


def test_a_broken_verifier_names_its_file_and_stage_train(verifier: Path) -> None:
    assert load_verifier(verifier).lam == 1.0
    weights = verifier.read_bytes()
    verifier.write_bytes(b"\xff" * 16 + weights[16:])
    with pytest.raises(CorruptInputError, match=f"{verifier.name}.*stage=train"):
        load_verifier(verifier)
    verifier.write_bytes(weights)
    sidecar = verifier.with_suffix(".json")
    truncate(sidecar)
    with pytest.raises(CorruptInputError, match=f"{sidecar.name}.*stage=train"):
        load_verifier(verifier)


def test_a_broken_sv_table_names_its_file_and_stage_tables(tmp_path: Path) -> None:
    path = tmp_path / "exp" / "tables" / "sv_table.json"
    entry = {"s_edges": [0, 0.5, 1], "a_edges": [0, 1], "p_accept": [[0.2], [0.9]]}
    entry["counts"] = [[3], [4]]
    write_json(path, sealed({"default": "2x1", "binnings": {"2x1": entry}}))
    assert SVTable.load(path).lookup(0.7, 0.5) == 0.9
    truncate(path)
    with pytest.raises(CorruptInputError, match="sv_table.json.*stage=tables experiment=exp"):
        SVTable.load(path)
    nan = sealed({"default": "2x1", "binnings": {"2x1": {**entry, "p_accept": [[NAN], [1]]}}})
    write_json(path, nan)
    with pytest.raises(CorruptInputError, match="sv_table.json.*stage=tables"):
        SVTable.load(path)


TABLE_ENTRY = {
    "s_edges": [0, 0.5, 1],
    "a_edges": [0, 0.25, 1],
    "p_accept": [[0.1, 0.3], [0.5, 0.9]],
    "counts": [[3, 4], [5, 6]],
}


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"s_edges": [1, 0.5, 0]}, "s_edges .* do not increase strictly"),
        ({"a_edges": [0, 1.25, 5]}, "a_edges run from 0.* to 5.*, not over"),
        ({"counts": [[3, 4], [5, -6]]}, "negative"),
        ({"counts": [[3, 4], [5, 60]]}, "counts summing to 72, but .* 18 rows"),
    ],
)
def test_a_table_with_impossible_edges_or_counts_is_refused(tmp_path, change, named) -> None:
    """Reversed S edges and A edges x5 passed the [0, 1] check (sv_table AUC 0.514, exit 0)."""
    path = tmp_path / "exp" / "tables" / "sv_table.json"
    good = {"default": "2x2", "rows": 18, "binnings": {"2x2": TABLE_ENTRY}}
    write_json(path, sealed(good))
    assert SVTable.load(path).lookup(0.7, 0.5) == 0.9
    write_json(path, sealed({**good, "binnings": {"2x2": {**TABLE_ENTRY, **change}}}))
    with pytest.raises(CorruptInputError, match=f"sv_table.json.*{named}.*stage=tables"):
        SVTable.load(path)


def test_an_edited_table_is_refused_naming_stage_tables(tmp_path) -> None:
    path = tmp_path / "exp" / "tables" / "sv_table.json"
    payload = sealed({"default": "2x2", "rows": 18, "binnings": {"2x2": TABLE_ENTRY}})
    payload["binnings"]["2x2"]["p_accept"] = [[0.9, 0.9], [0.9, 0.9]]  # a hand edit
    write_json(path, payload)
    with pytest.raises(CorruptInputError, match="content hash.*stage=tables experiment=exp"):
        SVTable.load(path)


def test_a_table_of_another_companion_is_refused_naming_the_field(tmp_path) -> None:
    """A table fitted for another companion ran unchecked in the bench."""
    path = tmp_path / "exp" / "tables" / "sv_table.json"
    companion = {"id": "tiny_random", "built": {"seed": 3}, "files": None}
    models = {"draft": {"id": "d"}, "companion": companion}
    payload = {"default": "2x2", "rows": 18, "binnings": {"2x2": TABLE_ENTRY}, "models": models}
    write_json(path, sealed(payload))
    table = SVTable.load(path)
    check_table_models(table, path, models, "exp")
    other = {**models, "companion": {**companion, "built": {"seed": 4}}}
    with pytest.raises(TableMismatchError, match="companion built .*seed.*stage=tables"):
        check_table_models(table, path, other, "exp")


def test_a_draft_with_a_smaller_vocabulary_than_the_tokenizer_is_refused(compose_cfg) -> None:
    cfg = compose_cfg(
        "stage=harvest",
        "models=tiny_random",
        "data.num_prompts=2",
        "+models.draft.config.vocab_size=64",
    )
    with pytest.raises(VocabularyError, match="draft model .* embeds 64 .* stage=distill"):
        run_stage(cfg)
    assert not (Path(cfg.experiment_dir) / "records").exists()


# -- 9. the distillation state is loaded without unpickling code -------------------------------


def test_the_distill_state_round_trips_with_weights_only(tmp_path: Path) -> None:
    student = build_tiny_model({"embed_rank": 8, "head_vocab_size": 16}, seed=0)
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3)
    student(input_ids=torch.tensor([[1, 2, 3]])).logits.float().logsumexp(-1).sum().backward()
    optimizer.step()
    state = DistillState(visits=2, tokens=512, curve=[{"tokens": 256, "loss": 1.5}])
    recipe = OmegaConf.to_container(OmegaConf.create({"init": "pca", "init_layers": [0, 1]}))
    path = tmp_path / "state.pt"
    save_checkpoint(path, student, optimizer, state, recipe)
    loaded = load_checkpoint(path)
    assert loaded is not None and loaded["state"] == state.__dict__
    assert loaded["recipe"] == recipe
    for name, tensor in student.state_dict().items():
        assert torch.equal(loaded["student"][name], tensor), name
    fresh = torch.optim.AdamW(student.parameters(), lr=1e-3)
    fresh.load_state_dict(loaded["optimizer"])
    assert fresh.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()


class _RunsCode:
    """Unpickling this calls Path.touch on the marker: what a crafted state.pt could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def test_a_state_file_that_would_run_code_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    path = tmp_path / "state.pt"
    torch.save({"state": _RunsCode(marker), "student": {}}, path)
    assert load_checkpoint(path) is None  # refused, reported, and training starts clean
    assert not marker.exists()


@pytest.mark.parametrize("stage", [None, "harvets"])
def test_a_missing_or_misspelt_stage_lists_the_stages(compose_cfg, stage: str | None) -> None:
    cfg = compose_cfg() if stage is None else compose_cfg(f"stage={stage}")
    with pytest.raises(ValueError, match=f"unknown stage {stage!r}; choose one of: harvest, "):
        run_stage(cfg)


@pytest.mark.heavy
def test_stage_all_with_one_lambda_evaluates_that_lambda(compose_cfg, tmp_path: Path) -> None:
    """`stage=all train.lam=1.2` (what the docs offer) trains one λ; evaluate scores that one
    instead of asking for the λ = 1 verifier nobody trained."""
    cfg = compose_cfg(
        "stage=all",
        "models=tiny_random",
        "data.num_prompts=12",
        "data.val_fraction=0.25",
        "data.test_fraction=0.25",
        "harvest.continuation_tokens=6",
        "train.lam=1.2",
        "train.all_labels=[ratio]",
        "all_steps=[harvest,train,tables,evaluate]",
        f"checkpoints_root={tmp_path / 'checkpoints'}",
    )
    result = run_stage(cfg)
    report = read_json(Path(result["evaluate"]["report"]))
    assert [n for n in report["auc"] if n.startswith("verifier_")] == ["verifier_lam1.2"]


def test_a_failed_resave_leaves_the_previous_verifier_whole(
    verifier: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save that dies before it is complete (here: writing the sidecar, as a full disk or
    `ulimit -f` does) keeps the old weights and sidecar, and leaves no temporary file."""
    before = (verifier.read_bytes(), verifier.with_suffix(".json").read_bytes())

    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    meta = {"lam": 1.0, "features": {"names": ["hidden"], "d_in": 8}}
    with pytest.raises(OSError, match="No space"):
        save_verifier(verifier, torch.full((8,), 2.0), torch.ones(1), meta)
    monkeypatch.undo()
    assert (verifier.read_bytes(), verifier.with_suffix(".json").read_bytes()) == before
    assert sorted(p.name for p in verifier.parent.iterdir()) == [
        "verifier-lam1.json",
        verifier.name,
    ]
    assert load_verifier(verifier).model.linear.weight.detach().flatten().tolist() == [1.0] * 8


def test_weights_without_their_own_sidecar_are_refused(verifier: Path, tmp_path: Path) -> None:
    """Weights moved in without their sidecar (a crash between the two moves) do not load
    with the old sidecar's settings."""
    other = tmp_path / "other" / verifier.name
    meta = {"lam": 1.0, "features": {"names": ["hidden"], "d_in": 8}}
    save_verifier(other, torch.full((8,), 2.0), torch.ones(1), meta)
    verifier.write_bytes(other.read_bytes())
    with pytest.raises(CorruptInputError, match="weights are not the ones verifier-lam1.json"):
        load_verifier(verifier)


def test_a_verifier_whose_lambda_is_not_its_names_is_refused(tmp_path: Path) -> None:
    """λ = 1.5 files copied as verifier-lam1.2.* would be reported and loaded as λ = 1.2."""
    meta = {"lam": 1.5, "features": {"names": ["hidden"], "d_in": 8}}
    source = save_verifier(verifier_path(tmp_path / "a", 1.5), torch.ones(8), torch.zeros(1), meta)
    copy = verifier_path(tmp_path / "b", 1.2)
    copy.parent.mkdir()
    copy.write_bytes(source.read_bytes())
    copy.with_suffix(".json").write_bytes(source.with_suffix(".json").read_bytes())
    with pytest.raises(CorruptInputError, match="lam 1.5, but the file is named for λ = 1.2"):
        load_verifier(copy)
