"""What an export folder holds, read from the folder or from the copy embedded in its
custom_generate/ (transformers copies only Python files into its module cache, so the folder's
data travel inside custom_generate/exported_files.py as base64).

export.json names the method, its settings, the files of its predictors, the models the
export was made for and the `decoding` settings it was made with (`DECODING`: the folder runs
without the project's conf/, so its engine takes conf/config.yaml's values as the export
recorded them); the predictors are stage=train's, stage=tables' and stage=bench's files,
byte for byte, read by the package's own readers (the verifier's checkpoint, SV's table, the
latency profile) as the bench reads them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import load as load_safetensors

from sprinter_train.bench.timing.latency import LatencyProfile
from sprinter_train.sv.table import SVTable
from sprinter_train.verifier.checkpoint import VerifierCheckpoint, checkpoint_of

MANIFEST = "export.json"
FORMAT_VERSION = 2  # 2: `decoding` recorded
DECODING = ("pack_every", "prefill_tokens")  # the decoding settings export.json records
REMEDY = "export the folder again with `python -m sprinter_train stage=export`"


@dataclass
class Bundle:
    manifest: dict[str, Any]
    files: Mapping[str, bytes]

    @classmethod
    def from_folder(cls, folder: str | Path) -> Bundle:
        folder = Path(folder)
        manifest = json.loads((folder / MANIFEST).read_text())
        names = [name for name in manifest["files"].values() if name]
        return cls(manifest, {name: (folder / name).read_bytes() for name in names})

    @classmethod
    def from_embedded(cls, files: Mapping[str, str]) -> Bundle:
        data = {name: base64.b64decode(text) for name, text in files.items()}
        return cls(json.loads(data.pop(MANIFEST)), data)

    @property
    def method(self) -> str:
        return str(self.manifest["method"])

    def model(self, role: str) -> dict[str, Any] | None:
        """The identity of the draft or companion the export was made for (None: none)."""
        return self.manifest["models"].get(role)

    def _file(self, key: str) -> bytes | None:
        name = self.manifest["files"].get(key)
        return None if not name else self.files[name]

    def verifier(self) -> VerifierCheckpoint | None:
        weights, sidecar = self._file("verifier"), self._file("verifier_sidecar")
        if weights is None or sidecar is None:
            return None
        path = Path(self.manifest["files"]["verifier"])
        return checkpoint_of(load_safetensors(weights), json.loads(sidecar), path, REMEDY)

    def table(self) -> SVTable | None:
        payload = self._file("table")
        if payload is None:
            return None
        return SVTable.from_json(json.loads(payload), self.manifest.get("table_binning"))

    def latency(self) -> LatencyProfile | None:
        profile = self._file("latency")
        return None if profile is None else LatencyProfile.from_json(json.loads(profile))

    def decoding(self) -> dict[str, int]:
        """The `decoding` settings the export was made with (`DECODING`); an export.json
        from before they were recorded is refused, naming the stage that rewrites it."""
        recorded = self.manifest.get("decoding") or {}
        missing = [f"decoding.{key}" for key in DECODING if key not in recorded]
        if missing:
            raise ValueError(
                f"{MANIFEST} (format_version {self.manifest.get('format_version')}) records no "
                f"{', '.join(missing)}, which the engine needs and which code keeps no default "
                f"of: {REMEDY}, which records conf/config.yaml's"
            )
        return {key: int(recorded[key]) for key in DECODING}

    def arguments(self) -> dict[str, Any]:
        """The method's keyword arguments: its predictors, its settings and the `decoding`
        settings the export was made with."""
        predictors = {
            "verifier": self.verifier(),
            "table": self.table(),
            "latency": self.latency(),
        }
        found = {key: value for key, value in predictors.items() if value is not None}
        return {**found, **self.manifest["settings"], "decoding": self.decoding()}
