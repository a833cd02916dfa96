"""Exported verifiers: `verifier-lam<λ>.safetensors` (label q/p <= λ) or
`verifier-accept.safetensors` (soft label min(1, p/q)), weight and bias, plus a `.json` sidecar.

The exported weights act on raw features (the training-time standardisation is folded in),
so a decoder computes V(s) = sigmoid((w·s + b) / T) with nothing else to load, T being the
sidecar's `calibration.temperature` (1 when absent: checkpoints from before calibration).
The sidecar also names the `label` ("ratio" when absent). It is written last: a checkpoint
whose sidecar exists is complete.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from sprinter_train.core.io import (
    MissingInputError,
    corrupt_input,
    file_sha256,
    json_text,
    read_json_input,
    temp_path,
)
from sprinter_train.verifier.features import FeatureSpec
from sprinter_train.verifier.labels import ACCEPT_NAME, LABELS, Label
from sprinter_train.verifier.labels import lam_name as lam_name  # the stages import it from here

FORMAT_VERSION = 1


def verifier_path(checkpoint_dir: str | Path, label: Label | float) -> Path:
    """verifier-lam<λ>.safetensors for a λ (or a ratio Label), verifier-accept.safetensors for
    the accept_prob Label."""
    return Path(checkpoint_dir) / f"verifier-{Label.of(label).name}.safetensors"


def sidecar_path(path: Path) -> Path:
    return Path(path).with_suffix(".json")


class LinearVerifier(torch.nn.Module):
    """SPRINTER's verifier: one Linear(d, 1) followed by a sigmoid, on raw features."""

    def __init__(self, d_in: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(d_in, 1)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(features.to(self.linear.weight.dtype)).squeeze(-1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """The raw probability the label names: P(q/p <= λ | s), or E[min(1, p/q) | s]."""
        return torch.sigmoid(self.logits(features))


@dataclass
class VerifierCheckpoint:
    model: LinearVerifier
    meta: dict[str, Any]
    path: Path

    @property
    def label(self) -> str:
        """ "ratio" (q/p <= λ) or "accept_prob" (min(1, p/q)); old sidecars: "ratio"."""
        return str(self.meta.get("label", "ratio"))

    @property
    def lam(self) -> float | None:
        """The λ of a ratio verifier; None for the accept_prob one, which has none."""
        lam = self.meta["lam"]
        return None if lam is None else float(lam)

    @property
    def temperature(self) -> float:
        """The calibration temperature fitted on the val split; 1 for old sidecars."""
        return float((self.meta.get("calibration") or {}).get("temperature", 1.0))

    @property
    def spec(self) -> FeatureSpec:
        features = self.meta["features"]
        return FeatureSpec.from_names(features["names"], features.get("settings"))

    def calibrated(self, logits: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        """sigmoid(logit / T), as a tensor for a tensor and as an array for an array."""
        if isinstance(logits, torch.Tensor):
            return torch.sigmoid(logits / self.temperature)
        return torch.sigmoid(torch.tensor(np.asarray(logits)) / self.temperature).numpy()

    @torch.no_grad()
    def logits(self, features: torch.Tensor, batch: int = 65536) -> np.ndarray:
        """w·s + b of float32 feature rows (batched: the rows may be many)."""
        out = [
            self.model.logits(features[i : i + batch]).numpy()
            for i in range(0, len(features), batch)
        ]
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

    @torch.no_grad()
    def score(self, features: torch.Tensor, batch: int = 65536) -> np.ndarray:
        """Raw (uncalibrated) sigmoid scores of float32 feature rows, what training fitted."""
        out = [self.model(features[i : i + batch]).numpy() for i in range(0, len(features), batch)]
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

    def calibrated_score(self, features: torch.Tensor, batch: int = 65536) -> np.ndarray:
        """sigmoid((w·s + b) / T): the probabilities the decoder's scorer returns."""
        logits = torch.from_numpy(self.logits(features, batch))
        return torch.sigmoid(logits / self.temperature).numpy()


def save_verifier(path: Path, weight: torch.Tensor, bias: torch.Tensor, meta: dict) -> Path:
    """Both files are written aside whole, then moved into place, weights first: a write that
    fails (a full disk, a file-size limit, a signal) leaves the previous verifier as it was.
    The sidecar names its weights' sha256, so weights moved in without their sidecar (a crash
    between the two moves) are refused on load rather than read with another's settings."""
    path = Path(path)
    sidecar = sidecar_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        "weight": weight.detach().float().reshape(1, -1).contiguous(),
        "bias": bias.detach().float().reshape(1).contiguous(),
    }
    aside = {path: temp_path(path), sidecar: temp_path(sidecar)}
    try:
        save_file(tensors, str(aside[path]), metadata={"format": str(FORMAT_VERSION)})
        digest = file_sha256(aside[path])
        payload = {"format_version": FORMAT_VERSION, **meta, "weights_sha256": digest}
        aside[sidecar].write_text(json_text(payload))
        for final, written in aside.items():
            os.replace(written, final)
    finally:
        for written in aside.values():
            written.unlink(missing_ok=True)
    return path


def load_verifier(path: str | Path, experiment: str | None = None) -> VerifierCheckpoint:
    """Load one exported verifier; a missing or corrupt one names the file and stage=train."""
    path = Path(path)
    sidecar = sidecar_path(path)
    exp = f" experiment={experiment}" if experiment else ""
    if path.stem == f"verifier-{ACCEPT_NAME}":
        which = "train.label=accept_prob"
    else:
        which = f"train.lam={path.stem.removeprefix('verifier-lam')}"
    command = f"`python -m sprinter_train stage=train{exp} {which}`"
    if not path.exists() or not sidecar.exists():
        raise MissingInputError(
            f"verifier checkpoint {path} (with its {sidecar.name}) does not exist: make it with "
            f"{command}"
        )
    remedy = f"rewrite the verifier with {command}"
    meta = read_json_input(sidecar, remedy)
    expected = meta.get("weights_sha256")
    if expected is not None and file_sha256(path) != expected:
        raise corrupt_input(
            path, f"its weights are not the ones {sidecar.name} was written with", remedy
        )
    try:
        tensors = load_file(str(path))
    except (OSError, SafetensorError) as error:
        raise corrupt_input(path, f"{type(error).__name__}: {error}", remedy) from error
    return checkpoint_of(tensors, meta, path, remedy)


def checkpoint_of(
    tensors: dict[str, torch.Tensor], meta: dict[str, Any], path: Path, remedy: str
) -> VerifierCheckpoint:
    """The checkpoint of a verifier's tensors and sidecar, checked as `load_verifier` checks
    a file's (an export folder reads them from the bytes it embeds); `path` and `remedy` name
    the file and its fix in errors."""
    sidecar = sidecar_path(path)
    if "lam" not in meta:
        raise corrupt_input(sidecar, "no lam", remedy)
    named = path.stem.removeprefix("verifier-lam") if path.stem.startswith("verifier-lam") else None
    if named and meta["lam"] is not None and lam_name(float(meta["lam"])) != named:
        raise corrupt_input(
            sidecar, f"lam {meta['lam']}, but the file is named for λ = {named}", remedy
        )
    try:
        weight, bias = tensors["weight"], tensors["bias"]
    except KeyError as error:
        raise corrupt_input(path, f"{type(error).__name__}: {error}", remedy) from error
    features = meta.get("features", {"names": []})
    if not isinstance(features, dict) or "names" not in features:
        raise corrupt_input(sidecar, "features without names", remedy)
    d_in = features.get("d_in")
    if weight.ndim != 2 or weight.shape[0] != 1 or bias.numel() != 1:
        raise corrupt_input(path, f"weight {tuple(weight.shape)}, bias {tuple(bias.shape)}", remedy)
    if d_in is not None and int(d_in) != weight.shape[1]:
        raise corrupt_input(
            path, f"{weight.shape[1]} weights, but {sidecar.name} says d_in {d_in}", remedy
        )
    check_label_and_calibration(meta, sidecar, remedy)
    model = LinearVerifier(int(weight.shape[1]))
    model.linear.weight.data.copy_(weight)
    model.linear.bias.data.copy_(tensors["bias"])
    return VerifierCheckpoint(model.eval(), meta, path)


def check_label_and_calibration(meta: dict[str, Any], sidecar: Path, remedy: str) -> None:
    """A sidecar's label and temperature must be usable (absent ones are old checkpoints)."""
    label = meta.get("label", "ratio")
    if label not in LABELS:
        raise corrupt_input(sidecar, f"label {label!r}, not one of {list(LABELS)}", remedy)
    if label == "ratio" and not isinstance(meta["lam"], int | float):
        raise corrupt_input(sidecar, f"a ratio label with lam {meta['lam']!r}", remedy)
    calibration = meta.get("calibration")
    if calibration is None:
        return
    temperature = calibration.get("temperature") if isinstance(calibration, dict) else None
    if not isinstance(temperature, int | float) or not np.isfinite(temperature) or temperature <= 0:
        raise corrupt_input(sidecar, f"calibration temperature {temperature!r}, not > 0", remedy)
