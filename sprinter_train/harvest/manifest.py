"""What a record set is: the fingerprint that decides whether a shard can be reused, and
`records/manifest.json`, which lets any later number be traced back to models and data."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

import sprinter_train
from sprinter_train.decoding.features.table import recorded_arrays
from sprinter_train.harvest.schema import HIDDEN_DTYPE, SCHEMA_VERSION, record_schema
from sprinter_train.harvest.shards import ShardPlan, read_records, shard_hashes
from sprinter_train.models.identity import content_digest, model_files
from sprinter_train.models.loading import LoadedModel, describe_spec, resolve_path, tokenizer_hash
from sprinter_train.models.roles import Roles


def code_version() -> str:
    """`git describe` of the checkout when there is one, else the package version."""
    root = Path(sprinter_train.__file__).resolve().parents[1]
    try:
        described = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--tags"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        described = ""
    return described or f"sprinter_train {sprinter_train.__version__}"


def _local_signature(spec: dict[str, Any]) -> str | None:
    """The content digest of a local model's weight and config files (models.identity): a
    retrained draft at the same path is new, a touched or cloned copy of the same bytes is not.
    Its card and pictures are left out: `draft_eval.update_model_card` rewrites the README,
    and that must not make every harvest and verifier of the same weights look stale."""
    path = str(spec.get("path") or "")
    if path == "tiny_random" or not path:
        return None  # its config and seed identify it (`built`)
    files = model_files(Path(resolve_path(path)), spec.get("gguf_file"))
    return content_digest(files)  # None for a hub id: its revision and commit identify it


def model_identity(loaded: LoadedModel) -> dict[str, Any]:
    """Everything that tells two models apart: the spec's id, a hub revision and commit, the
    local files' content digest, a tiny model's config and seed, the vocabulary size."""
    spec = loaded.spec
    return {
        "id": describe_spec(spec),
        "revision": spec.get("revision"),
        "commit": getattr(loaded.model.config, "_commit_hash", None),
        "files": _local_signature(spec),
        "built": built(spec),
        "vocab_size": int(loaded.model.config.vocab_size),
    }


def built(spec: dict[str, Any]) -> dict[str, Any] | None:
    """What a model built in code is made of: its config, seed (0 when unset, as it loads)
    and tokenizer settings; None for a model loaded from files."""
    if spec.get("path") != "tiny_random":
        return {k: spec[k] for k in ("config", "seed", "tokenizer") if k in spec} or None
    return {
        "config": spec.get("config") or {},
        "seed": int(spec.get("seed", 0)),
        "tokenizer": spec.get("tokenizer") or {},
    }


def harvest_fingerprint(
    models: Roles,
    settings: dict[str, Any],
    data_cfg: dict[str, Any],
    dtype: torch.dtype,
) -> str:
    """Hash of everything a shard's contents depend on (not the prompt count, batch size or
    world size: those change which shards exist or how fast, not what a shard holds)."""
    payload = {
        "schema_version": SCHEMA_VERSION,
        "models": {m.role: model_identity(m) for m in models.all()},
        "tokenizer": tokenizer_hash(models.tokenizer),
        "settings": settings,
        "data": {k: v for k, v in data_cfg.items() if k != "num_prompts"},
        "dtype": str(dtype),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[
        :16
    ]


def count_records(records_dir: Path, plans: list[ShardPlan]) -> dict[str, Any]:
    """Counts per shard, mix, split and both, read from the shards (two string columns only)."""
    mixes: list[str] = []
    splits: list[str] = []
    rows = {}
    for plan in plans:
        table = read_records(records_dir, [plan.name], columns=["mix", "split"])
        rows[plan.name] = table.num_rows
        mixes += table.column("mix").to_pylist()
        splits += table.column("split").to_pylist()
    prompts = Counter(m for plan in plans for m in plan.mixes)
    return {
        "records": len(mixes),
        "rows_by_shard": rows,
        "prompts": sum(len(p.prompts) for p in plans),
        "by_mix": dict(sorted(Counter(mixes).items())),
        "by_split": dict(sorted(Counter(splits).items())),
        "by_mix_split": dict(
            sorted(Counter(f"{m}/{s}" for m, s in zip(mixes, splits, strict=True)).items())
        ),
        "prompts_by_mix": dict(sorted(prompts.items())),
    }


def build_manifest(
    *,
    experiment: str,
    models: Roles,
    settings: dict[str, Any],
    config: dict[str, Any],
    interleaved: dict[str, Any],
    sampling: dict[str, Any],
    seeds: dict[str, int],
    data_cfg: dict[str, Any],
    plans: list[ShardPlan],
    counts: dict[str, Any],
    fingerprint: str,
    widths: dict[str, int],
    records_dir: Path,
    dtype: torch.dtype,
    device: str,
    world_size: int,
) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "stage": "harvest",
        "experiment": experiment,
        "fingerprint": fingerprint,
        "code_version": code_version(),
        "models": {m.role: model_identity(m) for m in models.all()},
        "companion": models.companion is not None,
        "tokenizer_hash": tokenizer_hash(models.tokenizer),
        "sampling": sampling,
        "seeds": seeds,
        "harvest": config,
        "content_settings": settings,
        "interleaved": interleaved,  # the interleaved mix's alpha and its source
        "data": data_cfg,
        "counts": counts,
        **array_sections(settings, widths),
        "columns": {f.name: str(f.type) for f in record_schema()},
        "nullable": ["S", "A"] if models.companion is None else [],
        "shards": [
            {
                "name": p.name,
                "prompts": len(p.prompts),
                "rows": counts["rows_by_shard"][p.name],
                "sha256": shard_hashes(records_dir, p.name),  # checked on every read
            }
            for p in plans
        ],
        "model_dtype": str(dtype),
        "device": device,
        "world_size": world_size,
        "pyarrow": pa.__version__,
    }


def array_sections(settings: dict[str, Any], widths: dict[str, int]) -> dict[str, Any]:
    """The manifest's section of each recorded array, under its feature's name: its width
    (`widths`), dtype and file, and what its declaration adds (`Array.about`: the draft's
    hidden layer)."""
    sections = {}
    for name, array in recorded_arrays().items():
        note = f" ({array.note})" if array.note else ""
        sections[name] = {
            **(array.about(settings) if array.about is not None else {}),
            "d": widths[name],
            "dtype": HIDDEN_DTYPE,
            "file": f"<shard>.{name}.npy, row i = parquet row i{note}",
        }
    return sections
