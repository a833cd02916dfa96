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
from sprinter_train.verifier.sidecar import HEADS, check_sidecar

FORMAT_VERSION = 1


def verifier_path(checkpoint_dir: str | Path, label: Label | float, head: str = "linear") -> Path:
    """verifier-lam<λ>.safetensors for a λ (or a ratio Label), verifier-accept.safetensors for
    the accept_prob Label; an MLP head's name ends in -mlp (verifier-lam1.2-mlp.safetensors)."""
    if head not in HEADS:
        raise ValueError(f"a verifier head is one of {HEADS}, got {head!r}")
    suffix = "" if head == "linear" else f"-{head}"
    return Path(checkpoint_dir) / f"verifier-{Label.of(label).name}{suffix}.safetensors"


def label_stem(path: Path) -> str:
    """The file's stem without the head's suffix: verifier-lam1.2 for verifier-lam1.2-mlp."""
    stem = Path(path).stem
    return stem.removesuffix("-mlp")


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


class MLPVerifier(torch.nn.Module):
    """train.head=mlp: Linear(d, h), ReLU, Linear(h, 1), sigmoid, on raw features (the
    standardisation folded into the first layer)."""

    def __init__(self, d_in: int, hidden: int) -> None:
        super().__init__()
        self.first = torch.nn.Linear(d_in, hidden)
        self.out = torch.nn.Linear(hidden, 1)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.first(features.to(self.first.weight.dtype)))
        return self.out(hidden).squeeze(-1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logits(features))

    def tensors(self) -> dict[str, torch.Tensor]:
        """What the safetensors file holds."""
        return {
            "weight": self.first.weight.detach(),
            "bias": self.first.bias.detach(),
            "out_weight": self.out.weight.detach(),
            "out_bias": self.out.bias.detach(),
        }

    @classmethod
    def of(cls, tensors: dict[str, torch.Tensor]) -> MLPVerifier:
        hidden, d_in = tensors["weight"].shape
        model = cls(int(d_in), int(hidden))
        model.first.weight.data.copy_(tensors["weight"])
        model.first.bias.data.copy_(tensors["bias"])
        model.out.weight.data.copy_(tensors["out_weight"].reshape(1, -1))
        model.out.bias.data.copy_(tensors["out_bias"].reshape(1))
        return model


@dataclass
class VerifierCheckpoint:
    model: LinearVerifier | MLPVerifier
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
    def head(self) -> str:
        """ "linear" (SPRINTER's; old sidecars) or "mlp"."""
        return str(self.meta.get("head", "linear"))

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


def save_verifier(
    path: Path,
    weight: torch.Tensor,
    bias: torch.Tensor,
    meta: dict,
    extra: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Both files are written aside whole, then moved into place, weights first: a write that
    fails (a full disk, a file-size limit, a signal) leaves the previous verifier as it was.
    The sidecar names its weights' sha256, so weights moved in without their sidecar (a crash
    between the two moves) are refused on load rather than read with another's settings."""
    path = Path(path)
    sidecar = sidecar_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if meta.get("head", "linear") == "linear":
        tensors = {
            "weight": weight.detach().float().reshape(1, -1).contiguous(),
            "bias": bias.detach().float().reshape(1).contiguous(),
        }
    else:  # an MLP's first layer, and its output layer in `extra`
        tensors = {
            "weight": weight.detach().float().contiguous(),
            "bias": bias.detach().float().contiguous(),
            **{k: v.detach().float().contiguous() for k, v in (extra or {}).items()},
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


def train_command(path: Path, experiment: str | None) -> str:
    """The `python -m sprinter_train stage=train ...` that writes the verifier at `path`."""
    exp = f" experiment={experiment}" if experiment else ""
    stem = label_stem(path)
    if stem == f"verifier-{ACCEPT_NAME}":
        which = "train.label=accept_prob"
    else:
        which = f"train.lam={stem.removeprefix('verifier-lam')}"
    if stem != Path(path).stem:
        which += f" train.head={Path(path).stem.rsplit('-', 1)[1]}"
    return f"`python -m sprinter_train stage=train{exp} {which}`"


def load_verifier(path: str | Path, experiment: str | None = None) -> VerifierCheckpoint:
    """Load one exported verifier; a missing or corrupt one names the file and stage=train."""
    path = Path(path)
    sidecar = sidecar_path(path)
    command = train_command(path, experiment)
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
    stem = label_stem(path)
    named = stem.removeprefix("verifier-lam") if stem.startswith("verifier-lam") else None
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
    check_sidecar(meta, sidecar, remedy)  # names, settings and head as train declares them
    d_in = features.get("d_in")
    if meta.get("head", "linear") == "mlp":
        return mlp_checkpoint(tensors, meta, path, remedy, d_in)
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


def mlp_checkpoint(
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
    path: Path,
    remedy: str,
    d_in: int | None,
) -> VerifierCheckpoint:
    """An MLP head's checkpoint, its tensors' shapes checked against each other and d_in."""
    try:
        weight, bias = tensors["weight"], tensors["bias"]
        out_weight, out_bias = tensors["out_weight"], tensors["out_bias"]
    except KeyError as error:
        raise corrupt_input(path, f"an MLP head without {error}", remedy) from error
    hidden = weight.shape[0] if weight.ndim == 2 else -1
    if bias.shape != (hidden,) or out_weight.numel() != hidden or out_bias.numel() != 1:
        raise corrupt_input(
            path,
            f"MLP tensors weight {tuple(weight.shape)}, bias {tuple(bias.shape)}, out_weight "
            f"{tuple(out_weight.shape)}, out_bias {tuple(out_bias.shape)}",
            remedy,
        )
    if d_in is not None and int(d_in) != weight.shape[1]:
        raise corrupt_input(
            path, f"{weight.shape[1]} inputs, but the sidecar says d_in {d_in}", remedy
        )
    check_label_and_calibration(meta, sidecar_path(path), remedy)
    return VerifierCheckpoint(MLPVerifier.of(tensors).eval(), meta, path)


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
