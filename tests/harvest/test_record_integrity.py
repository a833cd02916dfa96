"""Trust in the record set (issue 14, items 1 and 2): a garbled or changed shard file is an
error naming it and the command that redoes it, a rerun redoes only that shard, and two
harvests never write one experiment at once."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sprinter_train.__main__ import run_stage
from sprinter_train.core import pidlock
from sprinter_train.core.interrupt import StageInterrupted
from sprinter_train.core.io import CorruptInputError, read_json, write_json
from sprinter_train.core.processes import start_time
from sprinter_train.harvest.reader import open_records
from sprinter_train.harvest.schema import record_schema
from sprinter_train.harvest.shards import remove_stale_files, shard_files
from tests.harvest_helpers import TINY, compose_at
from tests.synthetic import write_synthetic_records


@pytest.fixture(scope="module")
def harvested(tmp_path_factory) -> Path:
    """A finished tiny harvest (3 shards), copied fresh for each test that damages it."""
    root = tmp_path_factory.mktemp("integrity")
    assert run_stage(compose_at(root))["shards_written"] == 3
    return root


@pytest.fixture
def fresh(harvested: Path, tmp_path: Path) -> Path:
    shutil.copytree(harvested, tmp_path / "root")
    return tmp_path / "root"


def records_of(root: Path) -> Path:
    return root / "default" / "records"


def test_the_manifest_holds_every_shard_files_sha256(harvested: Path) -> None:
    manifest = read_json(records_of(harvested) / "manifest.json")
    for shard in manifest["shards"]:
        assert set(shard["sha256"]) == {"records", "hidden", "target_hidden", "sequences"}
        assert all(len(h) == 64 for h in shard["sha256"].values())


def test_a_garbled_parquet_page_names_the_file_and_stage_harvest(fresh: Path) -> None:
    path = shard_files(records_of(fresh), "shard-000001")["records"]
    meta = pq.ParquetFile(path).metadata.row_group(0)
    chunk = meta.column(record_schema().get_field_index("S"))
    end = chunk.data_page_offset + chunk.total_compressed_size  # S's last page's values end here
    data = bytearray(path.read_bytes())
    data[end - 8 : end] = b"\x00\x00\x00\xf5" * 2  # two values garbled, headers intact
    path.write_bytes(bytes(data))
    match = f"(?s){path.name}.*stage=harvest"
    with pytest.raises(CorruptInputError, match=match):
        open_records(fresh / "default")
    with pytest.raises(CorruptInputError, match=match):
        open_records(fresh / "default", verify=False)  # the page checksums alone catch it


def finite_garbage(path: Path) -> None:
    """Overwrite the last 64 float16 values with 1.0: still a valid, finite array."""
    data = bytearray(path.read_bytes())
    data[-128:] = np.ones(64, dtype=np.float16).tobytes()
    path.write_bytes(bytes(data))


def test_a_changed_hidden_file_is_named_and_a_rerun_redoes_only_its_shard(fresh: Path) -> None:
    hidden = shard_files(records_of(fresh), "shard-000002")["hidden"]
    finite_garbage(hidden)
    with pytest.raises(CorruptInputError, match=f"{hidden.name}.*sha256.*stage=harvest"):
        open_records(fresh / "default")
    assert len(open_records(fresh / "default", verify=False).frame) == 48  # the speed switch
    result = run_stage(compose_at(fresh))
    assert (result["shards_written"], result["shards_skipped"]) == (1, 2)
    assert len(open_records(fresh / "default").frame) == 48


def test_non_finite_hidden_states_are_refused(tmp_path: Path) -> None:
    write_synthetic_records(tmp_path / "syn", rows=64, d=8, shard_rows=64)
    hidden = shard_files(tmp_path / "syn" / "records", "shard-000000")["hidden"]
    data = bytearray(hidden.read_bytes())
    data[-2:] = np.array([np.inf], dtype=np.float16).tobytes()
    hidden.write_bytes(bytes(data))
    with pytest.raises(CorruptInputError, match=f"{hidden.name}.*non-finite"):
        open_records(tmp_path / "syn")


@pytest.mark.parametrize(("column", "value"), [("S", -3.7e31), ("ratio", -1.0), ("q", 1.5)])
def test_values_out_of_their_known_range_are_refused(tmp_path: Path, column, value) -> None:
    write_synthetic_records(tmp_path / "syn", rows=64, d=8, shard_rows=64)
    path = shard_files(tmp_path / "syn" / "records", "shard-000000")["records"]
    table = pq.read_table(path)
    values = table.column(column).to_numpy().copy()
    values[3] = value
    table = table.set_column(
        table.schema.get_field_index(column), column, pa.array(values, pa.float32())
    )
    pq.write_table(table, path)  # valid page checksums: only the range check can tell
    with pytest.raises(CorruptInputError, match=f"{path.name}.*{column}.*stage=harvest"):
        open_records(tmp_path / "syn")


def test_a_second_harvest_of_one_experiment_fails_at_once_naming_the_holder(
    tmp_path: Path, sleeper
) -> None:
    lock = tmp_path / "default" / "writer.lock"
    holder = {"pid": sleeper.pid, "started": start_time(sleeper.pid)}
    write_json(lock, {"host": socket.gethostname(), "processes": [holder], "what": "harvest"})
    with pytest.raises(pidlock.LockHeldError, match=f"process {sleeper.pid}"):
        run_stage(compose_at(tmp_path))
    assert not (tmp_path / "default" / "records").exists()  # refused before any work
    assert lock.exists()


@pytest.mark.parametrize("stage", ["train", "tables", "evaluate", "bench"])
def test_every_writing_stage_takes_the_experiments_writer_lock(
    tmp_path: Path, sleeper, stage: str
) -> None:
    """A second stage writing into an experiment (two trains once interleaved their rows in
    one metrics.csv, the survivor exiting 0) fails at once naming the holder."""
    experiment = tmp_path / "default"
    write_synthetic_records(experiment, rows=256, d=8, shard_rows=256)
    holder = {"pid": sleeper.pid, "started": start_time(sleeper.pid)}
    lock = experiment / "writer.lock"
    write_json(lock, {"host": socket.gethostname(), "processes": [holder], "what": "train"})
    with pytest.raises(pidlock.LockHeldError, match=f"stage={stage} .* process {sleeper.pid}"):
        run_stage(compose_at(tmp_path, f"stage={stage}"))
    assert sorted(p.name for p in experiment.iterdir()) == ["records", "writer.lock"]


def test_a_live_writers_temporary_shard_file_is_never_swept(tmp_path: Path, sleeper) -> None:
    done = subprocess.Popen(["true"])
    done.wait()
    live = tmp_path / f".shard-000003.parquet.tmp{sleeper.pid}"
    dead = tmp_path / f".shard-000004.parquet.tmp{done.pid}"
    other = tmp_path / "shard-000009.parquet"  # a shard of no plan
    for path in (live, dead, other):
        path.write_bytes(b"x")
    removed = remove_stale_files(tmp_path, keep={"shard-000000"})
    assert sorted(removed) == sorted([dead.name, other.name])
    assert live.exists()


@pytest.mark.heavy
def test_two_harvests_at_once_the_second_is_refused_and_the_first_writes_every_shard(
    tmp_path: Path,
) -> None:
    """Two real processes on one experiment: the later one stops at once naming the holder,
    and the first finishes with every shard it planned (it once lost a finished shard to the
    second's sweep and crashed after all its compute)."""

    overrides = [f"artifacts_root={tmp_path}", *TINY, "data.num_prompts=24"]
    first = subprocess.Popen(
        [sys.executable, "-m", "sprinter_train", *overrides, "hydra.run.dir=" + str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lock = tmp_path / "default" / "writer.lock"
    try:
        deadline = time.monotonic() + 120
        while not lock.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lock.exists(), "the first harvest never took its lock"
        with pytest.raises(pidlock.LockHeldError, match=f"process {first.pid}"):
            run_stage(compose_at(tmp_path, "data.num_prompts=24"))
    finally:
        _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr[-2000:]
    manifest = read_json(records_of(tmp_path) / "manifest.json")
    assert len(manifest["shards"]) >= 2
    records = open_records(tmp_path / "default")  # every listed shard is there and intact
    assert len(records.shard_names) == len(manifest["shards"]) and len(records.frame) > 0
    assert not lock.exists()


def test_an_interrupted_harvest_counts_the_shards_it_kept(tmp_path: Path, monkeypatch) -> None:
    """SIGTERM while the third shard is being written: the report counts the two kept
    shards instead of saying "None of the parts it reports had finished"."""
    from sprinter_train.harvest import driver

    real, calls = driver.write_shard, []

    def write_then_stop(*args, **kwargs):
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        real(*args, **kwargs)
        calls.append(1)

    monkeypatch.setattr(driver, "write_shard", write_then_stop)
    with pytest.raises(StageInterrupted) as stop:
        run_stage(compose_at(tmp_path))
    assert "2 of 3 shards written to" in stop.value.report()
    assert len(list(records_of(tmp_path).glob("shard-*.parquet"))) >= 2
