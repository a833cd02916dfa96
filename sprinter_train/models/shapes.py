"""A model's sizes read from its config alone, without its weights.

Settings that index into a model (the draft hidden layer a harvest records, the target
layers a student copies) or must fit its width are checked against these before any model
loads: unchecked, `harvest.hidden_layer=99` loaded every model, started redoing a complete
record set and died with an IndexError. Reading a config costs a small file, or a GGUF's
first header entries (transformers' GGUF config parses every tokenizer entry too: seconds).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from transformers import AutoConfig

from sprinter_train.models import student as _student  # noqa: F401  (registers the draft config)
from sprinter_train.models.loading import (
    OFFLINE_HINT,
    ModelLoadError,
    describe_spec,
    looks_local,
    resolve_path,
)
from sprinter_train.models.tiny import tiny_config

# a GGUF's `<architecture>.<key>` -> the transformers config key it becomes
GGUF_SIZES = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
}
# a GGUF value type -> its struct code (8, a string, and 9, an array, are read apart)
GGUF_SCALARS = {
    **{0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?"},
    **{10: "Q", 11: "q", 12: "d"},
}
GGUF_STRING, GGUF_ARRAY = 8, 9


@dataclass(frozen=True)
class ModelShape:
    """What a settings check needs of one role's model: its name, its decoder layer count
    and hidden width (None where its config does not say)."""

    role: str
    name: str
    layers: int | None
    width: int | None

    def hidden_layers(self) -> str:
        """The values a hidden-layer setting may take on this model, in words."""
        return f"-1 (the last, normed state) or 0..{self.layers} (0: the embeddings)"

    def describe(self) -> str:
        layers = f"{self.layers} layer{'' if self.layers == 1 else 's'}"
        return f"the {self.role} model ({self.name}, {layers}, width {self.width})"


def model_shape(specs: dict[str, Any], role: str) -> ModelShape:
    """`role`'s model's shape, from the models spec (`cfg.models` as a plain dict): a tiny
    model's settings, a GGUF's header, or a folder's or hub id's config.json. A config that
    cannot be read is the error the load would give."""
    spec = dict(specs.get(role) or {})
    path = str(spec.get("path") or "")
    if not path:
        raise ModelLoadError(f"models.{role}.path is empty")
    if path == "tiny_random":
        sizes = tiny_config(dict(spec.get("config") or {})).to_dict()
    else:
        sizes = _read_sizes(spec, role, path)

    def size(key: str) -> int | None:
        value = sizes.get(key)
        return None if value is None else int(value)

    layers, width = (size(key) for key in GGUF_SIZES.values())
    return ModelShape(role, describe_spec(spec), layers, width)


def _read_sizes(spec: dict[str, Any], role: str, path: str) -> dict[str, Any]:
    resolved = resolve_path(path)
    if looks_local(path) and not Path(resolved).exists():
        raise ModelLoadError(f"the {role} model folder {resolved} does not exist")
    if spec.get("gguf_file"):
        gguf = Path(resolved) / str(spec["gguf_file"])
        if not gguf.exists():
            raise ModelLoadError(f"GGUF file not found: {gguf}")
        return gguf_sizes(gguf)
    try:
        kwargs = {"revision": spec["revision"]} if spec.get("revision") else {}
        trust = bool(spec.get("trust_remote_code", False))
        config = AutoConfig.from_pretrained(resolved, trust_remote_code=trust, **kwargs)
    except (OSError, ValueError) as error:
        local = Path(resolved).exists()
        where = f"local path {resolved}" if local else f"hub id {path!r}"
        raise ModelLoadError(
            f"could not read the {role} model's config from {where}: {error}\n"
            f"{'' if local else OFFLINE_HINT}"
        ) from error
    text = config.get_text_config()
    return {key: getattr(text, key, None) for key in GGUF_SIZES.values()}


def gguf_sizes(gguf: Path) -> dict[str, int]:
    """The transformers config keys of GGUF_SIZES, read from the GGUF header's key-value
    entries up to the last of them (the architecture's own come before the tokenizer's)."""
    found: dict[str, int] = {}
    with open(gguf, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ModelLoadError(f"{gguf} is not a GGUF file")
        version, _tensors, entries = struct.unpack("<IQQ", handle.read(20))
        if version < 2:
            raise ModelLoadError(f"{gguf} is a GGUF of version {version}: 2 or later is read")
        arch = ""
        for _ in range(entries):
            key = _string(handle)
            value = _value(handle, _unpack(handle, "I"))
            if key == "general.architecture":
                arch = str(value)
            elif arch and key.startswith(f"{arch}.") and key[len(arch) + 1 :] in GGUF_SIZES:
                found[GGUF_SIZES[key[len(arch) + 1 :]]] = int(value)
                if len(found) == len(GGUF_SIZES):
                    break
    return found


def _unpack(handle: BinaryIO, code: str) -> Any:
    size = struct.calcsize(code)
    return struct.unpack(f"<{code}", handle.read(size))[0]


def _string(handle: BinaryIO) -> str:
    return handle.read(_unpack(handle, "Q")).decode("utf-8", errors="replace")


def _value(handle: BinaryIO, kind: int) -> Any:
    """One entry's value; an array's items are skipped (None), none of GGUF_SIZES is one."""
    if kind == GGUF_STRING:
        return _string(handle)
    if kind == GGUF_ARRAY:
        item, count = _unpack(handle, "I"), _unpack(handle, "Q")
        if item in GGUF_SCALARS:
            handle.seek(count * struct.calcsize(GGUF_SCALARS[item]), 1)
        else:
            for _ in range(count):
                _value(handle, item)
        return None
    if kind not in GGUF_SCALARS:
        raise ModelLoadError(f"unknown GGUF value type {kind}")
    return _unpack(handle, GGUF_SCALARS[kind])


def hidden_layer_fits(layer: int, shape: ModelShape) -> bool:
    """Whether `hidden_states[layer]` exists on the model (-1: the final normed state; k >= 0
    indexes the embeddings and each layer's output, as `models.body.body` reads them)."""
    return layer == -1 or shape.layers is None or 0 <= layer <= shape.layers
