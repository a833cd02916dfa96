"""stage=export: a trained predictor as a folder Hugging Face `generate` runs by itself.

python -m sprinter_train stage=export experiment=<exp> export.method=<sprinter|sd_learned|svip|sv>

Reads the method's settings (conf/methods/<method>.yaml) and predictors: the verifier
(checkpoints/<exp>/verifier-*.safetensors + .json) for sprinter and sd_learned, SV's table
(artifacts/<exp>/tables/sv_table.json) for sv, the latency profile
(artifacts/<exp>/bench/latency.json) for the methods that plan with it; and the draft (and
companion) of `models`, whose identity the folder records. Writes
checkpoints/<exp>/export-<method>/ with sprinter_train/hf/folder.py: export.json (with the
`decoding` settings the engine takes: pack_every, prefill_tokens), the predictor
files byte for byte, README.md, and custom_generate/ (generate.py, the package's modules the
methods run, copied by hf/vendor.py, the predictor files embedded in exported_files.py,
requirements.txt). The folder is written beside its place and moved there whole once it loads
back.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import transformers
from omegaconf import DictConfig, OmegaConf

import sprinter_train.hf as hf_package
from sprinter_train.bench.run.methods import is_entropy, is_online, method_verifier_path
from sprinter_train.bench.timing.latency import LatencyProfile
from sprinter_train.core.io import MissingInputError, json_text
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.core.sweeps import job_dir
from sprinter_train.data.overlap import Reader
from sprinter_train.decoding.policies.registry import traits_of
from sprinter_train.harvest.manifest import code_version, model_identity
from sprinter_train.hf.bundle import DECODING, FORMAT_VERSION, MANIFEST
from sprinter_train.hf.folder import write_folder
from sprinter_train.hf.identity import model_identity as hf_identity
from sprinter_train.models.loading import LoadedModel, describe_spec, resolve_path
from sprinter_train.models.roles import load_role
from sprinter_train.sv.table import SVTable, check_fitted_table
from sprinter_train.verifier.checkpoint import load_verifier, sidecar_path
from sprinter_train.verifier.fit_check import check_fitted_verifier

log = logging.getLogger(__name__)

PREDICTOR_ENTRIES = ("verifier", "table")  # not settings: the folder carries their files


@dataclass
class Contents:
    """The folder's predictor files as export.json names them, with their bytes and sources."""

    names: dict[str, str | None] = field(
        default_factory=lambda: dict.fromkeys(("verifier", "verifier_sidecar", "table", "latency"))
    )
    data: dict[str, bytes] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def add(self, key: str, path: Path) -> None:
        self.names[key] = path.name
        self.data[path.name] = path.read_bytes()
        self.sources[key] = str(path)


def run(cfg: DictConfig) -> dict[str, Any]:
    method = str(cfg.export.method)
    if method not in hf_package.METHODS:
        raise ValueError(
            f"export.method={cfg.export.method!r}: choose one of {', '.join(hf_package.METHODS)}"
        )
    if method not in cfg.methods:
        raise ValueError(f"export.method={method} has no conf/methods/{method}.yaml")
    node = cfg.methods[method]
    needs = traits_of(node, method).needs
    out = Path(cfg.export.out_dir or job_dir(Path(cfg.checkpoint_dir) / f"export-{method}"))
    specs: dict[str, Any] = OmegaConf.to_container(cfg.models, resolve=True)  # type: ignore[assignment]
    # the verifier (its sidecar checked) before any model loads
    verifier = verifier_file(cfg, node) if "verifier" in needs else None
    draft = load_role(specs, "draft", pack_linear=False)  # float32 on the CPU: identity read
    contents, extra = Contents(), {}
    if verifier is not None:
        check_verifier_draft(verifier, cfg, draft)
        contents.add("verifier", verifier)
        contents.add("verifier_sidecar", sidecar_path(verifier))
    companion = None
    if uses_table(cfg, needs, node):
        if not specs.get("companion"):
            raise ValueError(f"{method} reads SV's table, which needs models.companion")
        path = Path(cfg.experiment_dir) / "tables" / "sv_table.json"
        table = SVTable.load(path, OmegaConf.select(node, "table.binning"))  # names stage=tables
        extra["table_binning"] = table.binning.name
        contents.add("table", path)
        companion = load_role(specs, "companion", pack_linear=False)
        ours = {"draft": model_identity(draft), "companion": model_identity(companion)}
        check_fitted_table(table, path, export_reader(cfg), ours, "")  # target: not loaded here
    if "latency" in needs:
        path = Path(cfg.experiment_dir) / "bench" / "latency.json"
        if not path.exists():
            raise MissingInputError(
                f"latency profile {path} does not exist: {method} plans with it; make it with "
                f"`python -m sprinter_train stage=bench experiment={cfg.experiment}`"
            )
        profile = LatencyProfile.load(path)
        extra["latency_measured_on"] = f"{profile.device}, {profile.dtype}"
        contents.add("latency", path)
    manifest = {
        "format_version": FORMAT_VERSION,
        "method": method,
        "settings": settings_of(method, node),
        "files": contents.names,
        **extra,
        "models": {
            "draft": identity(draft),
            "companion": None if companion is None else identity(companion),
            "target": {"name": describe_spec(specs["target"]), "load": loading(specs["target"])},
        },
        "sampling": OmegaConf.to_container(cfg.sampling, resolve=True),
        # the engine's settings from the decoding section: the folder runs without conf/
        "decoding": {key: int(cfg.decoding[key]) for key in DECODING},
        "experiment": str(cfg.experiment),
        "sources": contents.sources,
        "code_version": code_version(),
        "transformers_version": transformers.__version__,
    }
    files = {**contents.data, MANIFEST: json_text(manifest).encode()}
    written = write_folder(out, files, manifest)
    log.info("export %s -> %s (%d files)", method, out, len(written))
    return {"export_dir": str(out), "method": method, "files": written}


def verifier_file(cfg: DictConfig, node: DictConfig) -> Path:
    """The verifier the method's config names (the bench's choice), checked to load; an
    online one (learnt while decoding) or the entropy rule, which have no file, are refused:
    the folder carries a file."""
    if is_online(node.verifier) or is_entropy(node.verifier):
        kind = node.verifier.kind
        raise ValueError(
            "stage=export carries a trained verifier file; this method's verifier is "
            f"verifier.kind={kind} (a rule without a file): export it with a trained verifier "
            "(verifier.kind=checkpoint)"
        )
    path = method_verifier_path(cfg.checkpoint_dir, node)
    checkpoint = load_verifier(path, cfg.experiment)  # a missing or corrupt one names stage=train
    if checkpoint.head != "linear":
        raise ValueError(
            f"stage=export carries linear verifiers only (the folder's scorer is w·s + b); "
            f"{path} has a {checkpoint.head} head (train.head={checkpoint.head}): export with "
            "the linear one (the method's verifier.head=linear)"
        )
    return path


def check_verifier_draft(path: Path, cfg: DictConfig, draft: LoadedModel) -> None:
    """Refuse a verifier trained on another draft or sampling than the experiment's (the
    bench's check): the folder would record models and sampling it was never fitted on."""
    checkpoint = load_verifier(path, cfg.experiment)
    sampling = dataclasses.asdict(SamplingConfig.from_cfg(cfg.sampling))
    check_fitted_verifier(checkpoint, export_reader(cfg), model_identity(draft), sampling, "")


def export_reader(cfg: DictConfig) -> Reader:
    """stage=export as a reader of fitted artifacts (verifier/fit_check.py, sv/table.py): it scores no prompts,
    so only the models and sampling are checked."""
    return Reader("stage=export", None, False, "", str(cfg.experiment))


def uses_table(cfg: DictConfig, needs: frozenset[str], node: DictConfig) -> bool:
    """A method that needs a companion always reads SV's table; one that may read a table
    (sd_learned) when its config has one and a companion is configured."""
    if "companion" in needs:
        return True
    table = node.get("table") if "table" in node else None
    return "table" in needs and table is not None and bool(cfg.models.get("companion"))


def settings_of(method: str, node: DictConfig) -> dict[str, Any]:
    """The method's settings the callable takes (its keyword-only arguments), from its config."""
    params = inspect.signature(hf_package.METHODS[method]).parameters
    taken = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    values = OmegaConf.to_container(node, resolve=True)
    return {k: v for k, v in values.items() if k in taken and k not in PREDICTOR_ENTRIES}  # type: ignore[union-attr]


def identity(loaded: LoadedModel) -> dict[str, Any]:
    """What the folder checks a draft or companion against, and where it came from."""
    found = hf_identity(loaded.model, describe_spec(loaded.spec))
    remote = bool(getattr(loaded.model.config, "auto_map", None))
    return {**found, "load": loading(loaded.spec, remote), "source": model_identity(loaded)}


def loading(spec: dict[str, Any], remote_code: bool = False) -> dict[str, Any]:
    """How transformers loads the model of a spec: its folder (or hub id) and GGUF file."""
    path = resolve_path(str(spec["path"]))
    return {
        "path": str(Path(path).resolve()) if Path(path).exists() else path,
        "gguf_file": spec.get("gguf_file"),
        "remote_code": remote_code,
    }
