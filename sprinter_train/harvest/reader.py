"""Read a harvested record set (artifacts/<exp>/records/) for train, tables and evaluate.

The shard list comes from `records/manifest.json` (never from a folder glob); the manifest
exists only while the set is whole, so a missing one means the harvest has not finished.
The float16 arrays beside the records (one per recorded verifier feature: shards.array_kinds())
stay memory-mapped until a caller asks for the rows it needs. Every read checks the records'
page checksums and value ranges; with `verify` (harvest.verify_hashes, on by default) also each
shard file's sha256 against the manifest and that the arrays are finite.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sprinter_train.core.io import MissingInputError, corrupt_input, read_json_input
from sprinter_train.harvest.schema import HIDDEN_DTYPE, SCHEMA_VERSION
from sprinter_train.harvest.shards import (
    REDO,
    array_kinds,
    file_sha256,
    read_records,
    shard_files,
)

log = logging.getLogger(__name__)

HARVEST_HINT = "make them with `python -m sprinter_train stage=harvest experiment={exp}`"


@dataclass
class RecordSet:
    """The records of one experiment: a DataFrame of columns plus per-shard float16 arrays."""

    records_dir: Path
    manifest: dict[str, Any]
    manifest_hash: str
    frame: pd.DataFrame
    shard_names: list[str]
    shard_offsets: np.ndarray = field(repr=False)  # first global row of each shard, plus total

    @property
    def experiment(self) -> str:
        return str(self.manifest.get("experiment"))

    @property
    def content_id(self) -> str:
        """Identifies the records' contents (settings fingerprint and shard list): unlike the
        manifest's hash it survives a re-run harvest that rewrote the manifest only."""
        payload = {
            "fingerprint": self.manifest.get("fingerprint"),
            "shards": self.manifest["shards"],
        }
        text = json.dumps(payload, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def d(self) -> int:
        """Width of the draft's recorded hidden state, the `d` a verifier's sidecar holds."""
        return self.widths["hidden"]

    @property
    def widths(self) -> dict[str, int]:
        """The width of each recorded array (by feature name, as FeatureSpec.layout_of reads)."""
        return array_widths(self.manifest)

    @property
    def has_companion(self) -> bool:
        """SV's S and A are set (the harvest ran with a companion)."""
        if not self.manifest.get("companion"):
            return False
        return "S" not in self.frame or bool(self.frame["S"].notna().all())

    def rows_of(self, split: str | None) -> np.ndarray:
        """Global row indices of one split (the split is a hash of the prompt id), or all."""
        if split is None:
            return np.arange(len(self.frame))
        return np.flatnonzero(self.frame["split"].to_numpy() == split)

    def with_train_prompts(self, fraction: float, seed: int) -> RecordSet:
        """This record set with only a random `fraction` of the train prompts left in the
        train split (the rest marked `unused`); val and test are untouched. The subsets of
        one seed are nested: a smaller fraction keeps a prefix of the same prompt order."""
        if "prompt_id" not in self.frame:
            raise ValueError("with_train_prompts needs the records' prompt_id column")
        split = self.frame["split"].to_numpy().copy()
        train = split == "train"
        ids = self.frame["prompt_id"]
        prompts = np.sort(ids[train].unique().astype(str))  # a fixed order for the seed
        order = np.random.default_rng(seed).permutation(len(prompts))
        keep = prompts[order[: int(round(fraction * len(prompts)))]]
        # pandas' hash-based isin: np.isin on a million object ids takes minutes
        split[train & ~ids.isin(keep).to_numpy()] = "unused"
        frame = self.frame.copy()
        frame["split"] = split
        return replace(self, frame=frame)

    @property
    def target_d(self) -> int:
        """Width of the target's recorded hidden state (train.py's layout until it reads
        `widths`)."""
        return self.widths["target_hidden"]

    def hidden(self, rows: np.ndarray, kind: str = "hidden") -> np.ndarray:
        """float16 (len(rows), width) rows of one recorded array (`kind`: its feature's name;
        by default the draft's hidden state), the given global rows in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        width = self.widths[kind]
        out = np.empty((len(rows), width), dtype=HIDDEN_DTYPE)
        shard_of = np.searchsorted(self.shard_offsets, rows, side="right") - 1
        for s in np.unique(shard_of):
            where = np.flatnonzero(shard_of == s)
            mapped = map_hidden(
                shard_files(self.records_dir, self.shard_names[s])[kind],
                int(self.shard_offsets[s + 1] - self.shard_offsets[s]),
                width,
                HARVEST_HINT.format(exp=self.records_dir.parent.name),
            )
            local = rows[where] - self.shard_offsets[s]
            order = np.argsort(local, kind="stable")  # sorted reads from the map are faster
            out[where[order]] = mapped[local[order]]
        return out


def map_hidden(path: Path, rows: int, d: int, hint: str) -> np.ndarray:
    """A shard's float16 array, memory-mapped; a truncated file, or one of another shape or
    dtype than the manifest's, is an error naming it (the harvest redoes such a shard)."""
    remedy = f"rerun stage=harvest, which redoes only the broken shard ({hint})"
    try:
        mapped = np.load(path, mmap_mode="r")
    except (OSError, ValueError, EOFError) as error:
        raise corrupt_input(path, error, remedy) from error
    if mapped.dtype != np.dtype(HIDDEN_DTYPE) or mapped.shape != (rows, d):
        expected = f"{np.dtype(HIDDEN_DTYPE)} {(rows, d)}"
        raise corrupt_input(path, f"{mapped.dtype} {mapped.shape}, not {expected}", remedy)
    return mapped


def verify_hashes(cfg: Any) -> bool:
    """harvest.verify_hashes of a stage's config (on when unset)."""
    harvest = cfg.get("harvest") or {}
    return bool(harvest.get("verify_hashes", True))


def records_dir_of(experiment_dir: str | Path) -> Path:
    return Path(experiment_dir) / "records"


def verify_shards(records_dir: Path, manifest: dict[str, Any]) -> None:
    """Each shard file's sha256 against the manifest's and finite arrays; a mismatch
    is a CorruptInputError naming the file and the command that redoes its shard."""
    remedy = REDO.format(exp=records_dir.parent.name)
    unhashed = [s["name"] for s in manifest["shards"] if "sha256" not in s]
    if unhashed:
        log.warning(
            "%s: the manifest holds no content hashes for %d shards (written before hashes "
            "were recorded); rerun stage=harvest to add them",
            records_dir,
            len(unhashed),
        )
    for shard in manifest["shards"]:
        files = shard_files(records_dir, shard["name"])
        for kind, expected in shard.get("sha256", {}).items():
            if file_sha256(files[kind]) != expected:
                raise corrupt_input(
                    files[kind], "its sha256 differs from the one in manifest.json", remedy
                )
        hint = HARVEST_HINT.format(exp=records_dir.parent.name)
        for kind, d in array_widths(manifest).items():
            hidden = map_hidden(files[kind], int(shard["rows"]), d, hint)
            if not np.isfinite(hidden).all():
                raise corrupt_input(files[kind], f"non-finite {kind} values", remedy)


def array_widths(manifest: dict[str, Any]) -> dict[str, int]:
    """The width of each float16 array a shard holds beside its records (shards.array_kinds,
    each described in the manifest under its name)."""
    return {kind: int(manifest[kind]["d"]) for kind in array_kinds()}


class OldRecordsError(MissingInputError):
    """Records written under another SCHEMA_VERSION: their columns are not the ones read."""


def check_schema_version(
    manifest: dict[str, Any], records_dir: Path, stage: str, experiment: str
) -> None:
    """Refuse records of another schema version, naming the re-harvest command (the harvest's
    fingerprint holds the version, so it redoes every shard)."""
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise OldRecordsError(
            f"{stage}: {records_dir} holds records of schema version {version}, this code "
            f"reads version {SCHEMA_VERSION} (harvest/schema.py); re-harvest them with "
            f"`python -m sprinter_train stage=harvest experiment={experiment}`"
        )


def open_records(
    experiment_dir: str | Path,
    columns: list[str] | None = None,
    stage: str = "this stage",
    verify: bool = True,
) -> RecordSet:
    """Load the named columns of every shard in the manifest; fail naming stage=harvest.
    `verify=False` (harvest.verify_hashes=false) skips the hash and finite-array checks,
    which read every byte of the record set, for speed."""
    experiment_dir = Path(experiment_dir)
    records_dir = records_dir_of(experiment_dir)
    hint = HARVEST_HINT.format(exp=experiment_dir.name)
    if not records_dir.is_dir():
        raise MissingInputError(
            f"{stage} needs the records folder {records_dir}, which does not exist: {hint}"
        )
    manifest_path = records_dir / "manifest.json"
    if not manifest_path.exists():
        raise MissingInputError(
            f"{stage} needs {manifest_path}: the record set is incomplete (stage=harvest writes "
            f"the manifest last); finish it with the same stage=harvest command ({hint})"
        )
    manifest = read_json_input(
        manifest_path,
        f"rewrite it with the same stage=harvest command ({hint})",
        keys=("shards", *array_kinds()),
    )
    check_schema_version(manifest, records_dir, stage, experiment_dir.name)
    names = [s["name"] for s in manifest["shards"]]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:  # every row of the shard would be read twice
        raise corrupt_input(
            manifest_path,
            f"shard {', '.join(twice)} listed more than once",
            f"rewrite it with the same stage=harvest command ({hint})",
        )
    for name in names:
        for kind, path in shard_files(records_dir, name).items():
            if kind != "sequences" and not path.exists():
                raise MissingInputError(
                    f"{stage}: shard file {path} listed in the manifest is missing; rerun "
                    f"stage=harvest ({hint})"
                )
    for shard in manifest["shards"]:
        for kind, d in array_widths(manifest).items():
            map_hidden(shard_files(records_dir, shard["name"])[kind], int(shard["rows"]), d, hint)
    if verify:
        verify_shards(records_dir, manifest)
    table = read_records(records_dir, names, columns=columns)
    frame = table.to_pandas()
    rows = [int(s["rows"]) for s in manifest["shards"]]
    if sum(rows) != len(frame):
        raise ValueError(
            f"{records_dir}: the manifest counts {sum(rows)} records, the shards hold "
            f"{len(frame)}; rerun stage=harvest"
        )
    return RecordSet(
        records_dir=records_dir,
        manifest=manifest,
        manifest_hash=file_sha256(manifest_path)[:16],
        frame=frame,
        shard_names=names,
        shard_offsets=np.concatenate([[0], np.cumsum(rows)]).astype(np.int64),
    )
