"""Which model an export was made for, and the check that refuses another.

A verifier reads one draft's hidden states and SV's table one companion's distributions: with
another model of the same shapes the scores would be of numbers the predictor never saw, and
decoding would go on, quietly worse. The identity holds the model's name, type, vocabulary
and hidden size, a hash of its config (recorded, not checked: transformers versions add keys),
a hash of its parameter names and shapes, and a few values of every parameter, compared with
a tolerance wide enough for bfloat16 or float16 copies of the same weights and far below the
differences between two trained models.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

SAMPLES_PER_TENSOR = 4
RELATIVE, ABSOLUTE = 1e-2, 1e-5  # |a - b| <= RELATIVE * max(|a|, |b|) + ABSOLUTE
RUNTIME_KEYS = {  # config entries that say how a model runs, not what it is
    "dtype",
    "torch_dtype",
    "use_cache",
    "return_dict",
    "output_hidden_states",
    "output_attentions",
    "torchscript",
    "transformers_version",
}


class ModelMismatchError(ValueError):
    """A model other than the one an export was made for."""


def config_hash(config: Any) -> str:
    """sha256 of the config's entries, runtime and private ones left out."""
    entries = {
        k: v for k, v in config.to_dict().items() if k not in RUNTIME_KEYS and not k.startswith("_")
    }
    return hashlib.sha256(json.dumps(entries, sort_keys=True, default=str).encode()).hexdigest()


@torch.no_grad()
def model_identity(model: torch.nn.Module, name: str | None = None) -> dict[str, Any]:
    """What an export records of a model (JSON-ready)."""
    config = model.config
    layout, samples = [], []
    for key, param in model.named_parameters():
        layout.append([key, list(param.shape)])
        flat = param.detach().reshape(-1)
        index = torch.linspace(0, flat.numel() - 1, SAMPLES_PER_TENSOR).round().long()
        samples += flat[index.to(flat.device)].float().cpu().tolist()
    return {
        "name": name or getattr(config, "_name_or_path", None),
        "model_type": getattr(config, "model_type", None),
        "vocab_size": int(config.vocab_size),
        "hidden_size": int(getattr(config, "hidden_size", 0) or 0),
        "config_sha256": config_hash(config),
        "layout_sha256": hashlib.sha256(json.dumps(layout).encode()).hexdigest(),
        "weight_samples": samples,
    }


def identity_problems(expected: dict[str, Any], model: torch.nn.Module) -> list[str]:
    """How `model` differs from the model `expected` describes (empty: the same model)."""
    found = model_identity(model)
    problems = [
        f"{key} {found[key]!r} (exported for {expected[key]!r})"
        for key in ("model_type", "vocab_size", "hidden_size", "layout_sha256")
        if found[key] != expected[key]
    ]
    if problems:
        return problems
    pairs = zip(found["weight_samples"], expected["weight_samples"], strict=True)
    off = sum(abs(a - b) > RELATIVE * max(abs(a), abs(b)) + ABSOLUTE for a, b in pairs)
    if off:
        problems.append(f"{off} of {len(expected['weight_samples'])} sampled weights differ")
    return problems


def check_model(expected: dict[str, Any], model: torch.nn.Module, role: str) -> None:
    """Refuse a `role` model (draft, companion) other than the one the export was made for."""
    problems = identity_problems(expected, model)
    if problems:
        raise ModelMismatchError(
            f"this export was made for the {role} {expected.get('name')!r}, and the {role} "
            f"passed differs: {'; '.join(problems)}. Pass that {role}, or export again for "
            f"this one (python -m sprinter_train stage=export with models.{role} set to it)."
        )
