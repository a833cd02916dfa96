"""The scorer tests' toy records, written through the harvest's own writer (with the
records' history columns and the target's stale state), and the engine's view of them
(shared by test_verifier_scorer.py and test_mlp_head.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from sprinter_train.core.distributions import raw_entropy, top2_margin
from sprinter_train.core.io import write_json
from sprinter_train.core.sampling import SamplingConfig, warp_probs
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.batch import DecodeStats, DraftStep, RowState
from sprinter_train.harvest.continuations import HarvestSequence
from sprinter_train.harvest.mixes import MIXES
from sprinter_train.harvest.records import RecordBatch, history_columns, token_statistics
from sprinter_train.harvest.schema import SCHEMA_VERSION
from sprinter_train.harvest.shards import ShardPlan, write_shard
from sprinter_train.verifier.checkpoint import save_verifier, verifier_path

DRAFT = {"path": "tiny_random", "seed": 2, "config": {"num_hidden_layers": 1}}
VOCAB, EMBED = 128, 64  # the tiny draft's vocabulary and embedding width
D, ROWS = 24, 40  # recorded hidden width (any: the verifier only reads it), records
HISTORY = ("run_position", "accepted_before", "drafts_before")
TARGET_D = 16  # the recorded target hidden width
SETTINGS = {"run_position_cap": 3, "accept_prior": 0.4, "accept_n0": 2.0}
WIDTHS = {"hidden": D, "token_embedding": EMBED, "target_hidden": TARGET_D}


def write_records(experiment_dir: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """ROWS records written by the harvest's own writer, columns from token_statistics."""
    generator = torch.Generator().manual_seed(seed)
    q = warp_probs(2 * torch.randn(ROWS, VOCAB, generator=generator), SamplingConfig(top_k=40))
    p = torch.randn(ROWS, VOCAB, generator=generator).softmax(-1)
    x = q.argmax(-1)  # any token with q(x) > 0 will do: no sampler in the test
    hidden = torch.randn(ROWS, D, generator=generator).half()
    columns: dict[str, np.ndarray] = {
        "prompt_id": np.full(ROWS, "toy-0", dtype=object),
        "dataset": np.full(ROWS, "toy", dtype=object),
        "split": np.full(ROWS, "test", dtype=object),
        "mix": np.full(ROWS, MIXES[0], dtype=object),
        "position": np.arange(1, ROWS + 1, dtype=np.int32),
        "token_id": x.numpy().astype(np.int32),
        "S": np.full(ROWS, np.nan, dtype=np.float32),
        "A": np.full(ROWS, np.nan, dtype=np.float32),
    }
    for name, values in token_statistics(q, p, None, x).items():
        columns[name] = values.numpy().astype(np.float32)
    logits = q.log()  # the draft step's raw logits (below)
    columns["draft_margin"] = top2_margin(logits).numpy()
    columns["draft_entropy_raw"] = raw_entropy(logits).numpy()
    prompt = Prompt("toy-0", "toy", "test", "", [], None)
    plan = ShardPlan(0, (prompt,), (MIXES[0],))
    flags = tuple(bool(f) for f in torch.rand(ROWS + 1, generator=generator) < 0.7)
    sequence = HarvestSequence(prompt, MIXES[0], [1] * (ROWS + 1), 1, ROWS + 1, flags)
    columns.update(history_columns(sequence, columns["accept_prob"]))
    records_dir = experiment_dir / "records"
    records_dir.mkdir(parents=True)
    target = torch.randn(ROWS, TARGET_D, generator=generator).half()
    columns["target_margin"] = torch.rand(ROWS, generator=generator).numpy() * 3
    batch = RecordBatch(columns, {"hidden": hidden.numpy(), "target_hidden": target.numpy()})
    write_shard(records_dir, plan, batch, [sequence], "toy")
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "experiment": experiment_dir.name,
        "models": {"draft": {"id": "tiny_random"}},
        "companion": False,
        "hidden": {"layer": -1, "d": D, "dtype": "float16"},
        "target_hidden": {"d": TARGET_D, "dtype": "float16"},
        "shards": [{"name": plan.name, "rows": ROWS}],
    }
    write_json(records_dir / "manifest.json", manifest)
    history = {k: torch.from_numpy(columns[k]) for k in HISTORY}
    margin = torch.from_numpy(columns["target_margin"])
    return {
        "q": q,
        "x": x,
        "hidden": hidden,
        "target_hidden": target,
        "target_margin": margin,
        **history,
    }


def export_verifier(
    checkpoint_dir: Path,
    names: list[str],
    d_in: int,
    seed: int = 0,
    temperature: float | None = None,
    bias: float | None = None,
) -> Path:
    """A verifier with random weights, exported as stage=train exports one (with a
    calibration temperature when one is given; without, an old sidecar)."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(d_in, generator=generator) / d_in**0.5
    b = torch.randn(1, generator=generator) if bias is None else torch.tensor([bias])
    meta: dict = {"lam": 1.0, "features": {"names": names, "settings": SETTINGS}}
    if temperature is not None:
        meta["label"] = "ratio"
        meta["calibration"] = {"method": "temperature", "temperature": temperature}
    return save_verifier(verifier_path(checkpoint_dir, 1.0), weight, b, meta)


def width(names: list[str]) -> int:
    return sum(WIDTHS.get(n, 1) for n in names)


def draft_step(record: dict[str, torch.Tensor], rows: list[int]) -> DraftStep:
    """The engine's view of records' drafted tokens as a batch's rows (their hidden states
    in float32)."""
    index = torch.tensor(rows)
    q = record["q"][index]
    active = torch.ones(len(rows), dtype=torch.bool)
    return DraftStep(record["x"][index].long(), q, record["hidden"][index].float(), q.log(), active)


def new_batch(record: dict[str, torch.Tensor] | None = None, rows: list[int] = ()) -> Any:
    """What the verifier reads of a batch: its stats, and the rows' state where the records'
    history is given (each record the first draft of its round: step index 0)."""
    state = None
    if record is not None:
        index = torch.tensor(list(rows))
        state = RowState(
            record["run_position"][index].long(),
            record["accepted_before"][index].float(),
            record["drafts_before"][index].float(),
            record["target_hidden"][index].float(),
            record["target_margin"][index].float(),
        )
    return SimpleNamespace(stats=DecodeStats(), state=state)
