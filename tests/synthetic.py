"""Synthetic record sets in the harvest's on-disk format, with a known answer.

Acceptability is planted along one hidden direction: log(q/p) = -margin * (h · w) + noise,
so a linear verifier that finds w separates the classes (tests, the training benchmark);
A is min(1, p/q) plus noise, so S and A carry information about X. Everything else has the
schema's types and plausible values, nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sprinter_train.core.io import atomic_write, write_json
from sprinter_train.data.split import split_of
from sprinter_train.harvest.mixes import MIXES
from sprinter_train.harvest.schema import SCHEMA_VERSION, SEQUENCE_SCHEMA, record_schema
from sprinter_train.harvest.shards import shard_files

TARGET_D = 4  # width of the synthetic target hidden state (noise: nothing is planted in it)
# the default features less token_embedding: synthetic token ids come from no draft, so the
# embedding the default reads cannot be looked up (stage=train refuses it, naming the draft)
SYNTHETIC_FEATURES = (
    "train.features=[hidden,q,draft_entropy,draft_margin,draft_entropy_raw,run_position,"
    "accept_so_far]"
)


def planted_direction(d: int, seed: int) -> np.ndarray:
    w = np.random.default_rng(seed + 7919).standard_normal(d)
    return w / np.linalg.norm(w)


def _save_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as handle:
        np.save(handle, array)


def _columns(
    rng: np.random.Generator, hidden: np.ndarray, w: np.ndarray, margin: float, noise: float
) -> dict[str, np.ndarray]:
    n = len(hidden)
    log_ratio = -margin * (
        hidden.astype(np.float32) @ w.astype(np.float32)
    ) + noise * rng.standard_normal(n)
    q = rng.uniform(0.05, 0.95, n)
    p = np.minimum(q / np.exp(log_ratio), 1.0)
    ratio = q / p
    accept = np.minimum(1.0, p / q)
    beta = np.clip(0.5 * accept + 0.5 * rng.uniform(0.3, 1.0, n), 0.0, 1.0)
    return {
        "q": q,
        "p": p,
        "ratio": ratio,
        "accept_prob": accept,
        "beta": beta,
        "draft_entropy": np.abs(rng.normal(1.0 - 0.6 * accept, 0.3)),
        "target_entropy": np.abs(rng.normal(1.0, 0.3, n)),
        "S": np.clip(beta + rng.normal(0, 0.05, n), 0.0, 1.0),
        "A": np.clip(accept + rng.normal(0, 0.15, n), 0.0, 1.0),
        "draft_margin": np.abs(rng.normal(2.0 * accept, 1.0)),
        "draft_entropy_raw": np.abs(rng.normal(2.0 - accept, 0.3)),
        "target_margin": np.abs(rng.normal(1.0, 0.5, n)),
    }


def _history(accept: np.ndarray, positions: int, from_draft: np.ndarray) -> dict[str, np.ndarray]:
    """Per prompt (`positions` consecutive rows): the run of draft-made tokens before each
    position (from the prompt's `from_draft` flags over its region) and the running sum and
    count of the earlier rows' accept_prob."""
    n = len(accept)
    local = np.arange(n) % positions
    runs = np.zeros(n, dtype=np.int32)
    for i in range(n):
        if local[i] and from_draft[i - 1]:
            runs[i] = runs[i - 1] + 1
    sums = np.zeros(n)
    for i in range(1, n):
        sums[i] = 0.0 if local[i] == 0 else sums[i - 1] + accept[i - 1]
    return {"run_position": runs, "accepted_before": sums, "drafts_before": local}


def write_synthetic_records(
    experiment_dir: str | Path,
    rows: int,
    d: int,
    positions: int = 32,
    shard_rows: int = 65536,
    margin: float = 3.0,
    noise: float = 0.5,
    seed: int = 0,
    split_seed: int = 0,
    models: dict[str, Any] | None = None,
    edit: Callable[[dict[str, np.ndarray], np.random.Generator], None] | None = None,
) -> dict[str, Any]:
    """Write records/ (shards + manifest) for `rows` records of `positions` per prompt;
    `models`: the manifest's role -> model_identity (default: placeholders no bench runs);
    `edit` may change a shard's columns in place before they are written (plant a signal
    elsewhere than the hidden state)."""
    records_dir = Path(experiment_dir) / "records"
    records_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = planted_direction(d, seed)
    per_shard = max(positions, shard_rows // positions * positions)
    shards, prompt = [], 0
    for index, start in enumerate(range(0, rows, per_shard)):
        n = min(per_shard, rows - start)
        hidden = rng.standard_normal((n, d), dtype=np.float32).astype(np.float16)
        cols = _columns(rng, hidden, w, margin, noise)
        from_draft = rng.uniform(size=n) < 0.6  # the region's token at each row
        cols.update(_history(cols["accept_prob"], positions, from_draft))
        if edit is not None:
            edit(cols, rng)
        local = np.arange(n)
        prompt_idx = prompt + local // positions
        ids = np.array([f"synthetic-{i}" for i in range(prompt, int(prompt_idx[-1]) + 1)])
        prompt_ids = ids[prompt_idx - prompt]
        splits = np.array([split_of(i, split_seed) for i in ids])[prompt_idx - prompt]
        mixes = np.array(MIXES)[(prompt_idx % len(MIXES))]
        position = (16 + local % positions).astype(np.int32)
        columns = {
            "prompt_id": prompt_ids,
            "dataset": np.full(n, "synthetic"),
            "split": splits,
            "mix": mixes,
            "position": position,
            "token_id": rng.integers(0, 1000, n).astype(np.int32),
            **cols,
        }
        table = pa.Table.from_arrays(
            [pa.array(columns[f.name], type=f.type) for f in record_schema()],
            schema=record_schema(),
        )
        name = f"shard-{index:06d}"
        files = shard_files(records_dir, name)
        atomic_write(files["hidden"], lambda tmp, h=hidden: _save_npy(tmp, h))
        target = rng.standard_normal((n, TARGET_D), dtype=np.float32).astype(np.float16)
        atomic_write(files["target_hidden"], lambda tmp, h=target: _save_npy(tmp, h))
        seq_ids = list(dict.fromkeys(prompt_ids.tolist()))
        first = {pid: i for i, pid in reversed(list(enumerate(prompt_ids.tolist())))}
        sequences = pa.Table.from_pydict(
            {
                "prompt_id": seq_ids,
                "dataset": ["synthetic"] * len(seq_ids),
                "split": [str(splits[first[s]]) for s in seq_ids],
                "mix": [str(mixes[first[s]]) for s in seq_ids],
                "input_ids": [[1] * (16 + positions)] * len(seq_ids),
                "region_start": [16] * len(seq_ids),
                "region_end": [16 + positions] * len(seq_ids),
                "from_draft": [
                    [False] * 16 + from_draft[first[s] : first[s] + positions].tolist()
                    for s in seq_ids
                ],
            },
            schema=SEQUENCE_SCHEMA,
        )
        atomic_write(files["sequences"], lambda tmp, t=sequences: pq.write_table(t, tmp))
        atomic_write(files["records"], lambda tmp, t=table: pq.write_table(t, tmp))
        shards.append({"name": name, "prompts": len(seq_ids), "rows": n})
        prompt = int(prompt_idx[-1]) + 1
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "stage": "synthetic",
        "experiment": Path(experiment_dir).name,
        "fingerprint": f"synthetic-{seed}-{rows}-{d}",
        "models": models or {"draft": {"id": "synthetic"}, "companion": {"id": "synthetic"}},
        "companion": True,
        "sampling": None,
        "hidden": {"layer": -1, "d": d, "dtype": "float16"},
        "target_hidden": {"d": TARGET_D, "dtype": "float16"},
        "shards": shards,
        "counts": {"records": rows, "prompts": prompt},
        "planted": {"margin": margin, "noise": noise, "seed": seed},
    }
    write_json(records_dir / "manifest.json", manifest)
    return {"records_dir": records_dir, "direction": w, "manifest": manifest}
