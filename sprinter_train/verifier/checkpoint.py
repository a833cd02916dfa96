"""Exported verifiers: `verifier-lam<λ>.safetensors` (weight, bias) plus a `.json` sidecar.

The exported weights act on raw features (the training-time standardisation is folded in),
so a decoder computes V(s) = sigmoid(w·s + b) with nothing else to load. The sidecar is
written last: a checkpoint whose sidecar exists is complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from sprinter_train.core.io import atomic_write, corrupt_input, read_json_input, write_json
from sprinter_train.harvest.reader import MissingInputError
from sprinter_train.verifier.features import FeatureSpec

FORMAT_VERSION = 1


def lam_name(lam: float) -> str:
    """1.0 -> '1', 1.2 -> '1.2': the λ in file names and report keys."""
    return f"{float(lam):g}"


def verifier_path(checkpoint_dir: str | Path, lam: float) -> Path:
    return Path(checkpoint_dir) / f"verifier-lam{lam_name(lam)}.safetensors"


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
        """P(q/p <= λ | s): the probability that the draft token is acceptable."""
        return torch.sigmoid(self.logits(features))


@dataclass
class VerifierCheckpoint:
    model: LinearVerifier
    meta: dict[str, Any]
    path: Path

    @property
    def lam(self) -> float:
        return float(self.meta["lam"])

    @property
    def spec(self) -> FeatureSpec:
        return FeatureSpec.from_names(self.meta["features"]["names"])

    @torch.no_grad()
    def score(self, features: torch.Tensor, batch: int = 65536) -> np.ndarray:
        """Sigmoid scores of float32 feature rows (batched: the rows may be many)."""
        out = [self.model(features[i : i + batch]).numpy() for i in range(0, len(features), batch)]
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)


def save_verifier(path: Path, weight: torch.Tensor, bias: torch.Tensor, meta: dict) -> Path:
    """Weights first, sidecar last (the sidecar marks a whole checkpoint)."""
    path = Path(path)
    sidecar = sidecar_path(path)
    sidecar.unlink(missing_ok=True)
    tensors = {
        "weight": weight.detach().float().reshape(1, -1).contiguous(),
        "bias": bias.detach().float().reshape(1).contiguous(),
    }
    atomic_write(
        path, lambda tmp: save_file(tensors, str(tmp), metadata={"format": str(FORMAT_VERSION)})
    )
    write_json(sidecar, {"format_version": FORMAT_VERSION, **meta})
    return path


def load_verifier(path: str | Path, experiment: str | None = None) -> VerifierCheckpoint:
    """Load one exported verifier; a missing or corrupt one names the file and stage=train."""
    path = Path(path)
    sidecar = sidecar_path(path)
    lam = path.stem.removeprefix("verifier-lam")
    exp = f" experiment={experiment}" if experiment else ""
    command = f"`python -m sprinter_train stage=train{exp} train.lam={lam}`"
    if not path.exists() or not sidecar.exists():
        raise MissingInputError(
            f"verifier checkpoint {path} (with its {sidecar.name}) does not exist: make it with "
            f"{command}"
        )
    remedy = f"rewrite the verifier with {command}"
    meta = read_json_input(sidecar, remedy, keys=("lam",))
    try:
        tensors = load_file(str(path))
        weight, bias = tensors["weight"], tensors["bias"]
    except (OSError, KeyError, SafetensorError) as error:
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
    model = LinearVerifier(int(weight.shape[1]))
    model.linear.weight.data.copy_(weight)
    model.linear.bias.data.copy_(tensors["bias"])
    return VerifierCheckpoint(model.eval(), meta, path)
