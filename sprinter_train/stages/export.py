"""stage=export: a trained predictor as a folder Hugging Face `generate` runs by itself.

python -m sprinter_train stage=export experiment=<exp> export.method=<sprinter|sd_learned|svip|sv>

Reads the method's settings (conf/methods/<method>.yaml) and predictors: the verifier
(checkpoints/<exp>/verifier-*.safetensors + .json) for sprinter and sd_learned, SV's table
(artifacts/<exp>/tables/sv_table.json) for sv, the latency profile
(artifacts/<exp>/bench/latency.json) for the methods that plan with it; and the draft (and
companion) of `models`, whose identity the folder records. Writes
checkpoints/<exp>/export-<method>/: export.json, the predictor files byte for byte, README.md,
and custom_generate/ (generate.py, the modules of sprinter_train/hf copied verbatim, the
predictor files embedded in exported_files.py, requirements.txt). The folder is written
beside its place and moved there whole once it loads back.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from omegaconf import DictConfig, OmegaConf

import sprinter_train.hf as hf_package
from sprinter_train.bench.latency import LatencyProfile
from sprinter_train.bench.methods import VerifierMismatchError, method_verifier_path
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.harvest.manifest import code_version, model_identity
from sprinter_train.harvest.reader import MissingInputError
from sprinter_train.hf.bundle import FORMAT_VERSION, MANIFEST, Bundle, embedded_source
from sprinter_train.hf.identity import model_identity as hf_identity
from sprinter_train.models.loading import LoadedModel, describe_spec, load_model, resolve_path
from sprinter_train.sv.table import SVTable
from sprinter_train.verifier.checkpoint import load_verifier, sidecar_path

log = logging.getLogger(__name__)

PREDICTOR_ENTRIES = ("verifier", "table", "latency", "step_cost")  # not settings
VERIFIED = ("sprinter", "sd_learned")
PLANNED = ("sv", "sd_learned")  # plan with the latency profile
GENERATE_PY = '''"""custom_generate entry of a sprinter_train export ({method}), written by stage=export.

    out = target.generate(**inputs, custom_generate="<this folder>", trust_remote_code=True,
                          assistant_model=draft, max_new_tokens=64)
"""

from .exported_files import FILES
from .methods import exported_generate


def generate(model, **kwargs):
    """Decode one sequence with {method} and this folder's predictors."""
    return exported_generate(model, FILES, **kwargs)
'''
REQUIREMENTS = "torch\ntransformers>=5.17,<6\nsafetensors\nnumpy\n"


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
    out = Path(cfg.export.out_dir or Path(cfg.checkpoint_dir) / f"export-{method}")
    specs: dict[str, Any] = OmegaConf.to_container(cfg.models, resolve=True)  # type: ignore[assignment]
    draft = load_role(specs, "draft")
    contents, extra = Contents(), {}
    if method in VERIFIED:
        path = verifier_file(cfg, node)
        check_verifier_draft(path, cfg, draft)
        contents.add("verifier", path)
        contents.add("verifier_sidecar", sidecar_path(path))
    companion = None
    if uses_table(cfg, method, node):
        if not specs.get("companion"):
            raise ValueError(f"{method} reads SV's table, which needs models.companion")
        path = Path(cfg.experiment_dir) / "tables" / "sv_table.json"
        table = SVTable.load(path, OmegaConf.select(node, "table.binning"))  # names stage=tables
        extra["table_binning"] = table.binning.name
        contents.add("table", path)
        companion = load_role(specs, "companion")
    if method in PLANNED:
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
        "experiment": str(cfg.experiment),
        "sources": contents.sources,
        "code_version": code_version(),
        "transformers_version": transformers.__version__,
    }
    files = {**contents.data, MANIFEST: json_text(manifest).encode()}
    written = write_folder(out, files, manifest)
    log.info("export %s -> %s (%d files)", method, out, len(written))
    return {"export_dir": str(out), "method": method, "files": written}


def load_role(specs: dict[str, Any], role: str) -> LoadedModel:
    """The draft or companion of `models`, in float32 on the CPU (its identity is read)."""
    return load_model(specs[role], role, torch.device("cpu"), torch.float32, specs.get("cache_dir"))


def verifier_file(cfg: DictConfig, node: DictConfig) -> Path:
    """The verifier the method's config names (the bench's choice), checked to load."""
    path = method_verifier_path(cfg.checkpoint_dir, node)
    load_verifier(path, cfg.experiment)  # a missing or corrupt one names stage=train
    return path


def check_verifier_draft(path: Path, cfg: DictConfig, draft: LoadedModel) -> None:
    """Refuse a verifier trained on another draft or sampling than the experiment's (the
    bench's check): the folder would record models and sampling it was never fitted on."""
    meta = load_verifier(path, cfg.experiment).meta
    ours = model_identity(draft)
    problems = [
        f"{key} {meta[key]!r} (models.draft: {ours[field]!r})"
        for key, field in (("draft_model", "id"), ("draft_model_files", "files"))
        if meta.get(key) is not None and meta[key] != ours[field]
    ]
    sampling = dataclasses.asdict(SamplingConfig.from_cfg(cfg.sampling))
    if meta.get("sampling") is not None and meta["sampling"] != sampling:
        problems.append(f"sampling {meta['sampling']} (the config's: {sampling})")
    if problems:
        raise VerifierMismatchError(
            f"{path} was trained with {'; '.join(problems)}: export with the models and "
            "sampling it was trained with, or train it again for these"
        )


def uses_table(cfg: DictConfig, method: str, node: DictConfig) -> bool:
    """sv always; sd_learned when its config has a table and a companion is configured."""
    if method == "sv":
        return True
    table = node.get("table") if "table" in node else None
    return method == "sd_learned" and table is not None and bool(cfg.models.get("companion"))


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


def json_text(payload: Any) -> str:
    return json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n"


def write_folder(out: Path, files: dict[str, bytes], manifest: dict[str, Any]) -> list[str]:
    """Write the folder beside `out`, load it back (folder and embedded copy), then swap it in;
    a failure leaves no partial folder."""
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        fill(tmp, files, manifest)
        for bundle in (Bundle.from_folder(tmp), Bundle.from_embedded(embedded_files(tmp))):
            bundle.arguments()  # every predictor parses
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def fill(folder: Path, files: dict[str, bytes], manifest: dict[str, Any]) -> None:
    """The predictor files and export.json, README.md, and custom_generate/: generate.py,
    sprinter_train/hf's modules verbatim, the embedded files, requirements.txt."""
    code = folder / "custom_generate"
    code.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    for module in sorted(Path(hf_package.__file__).parent.glob("*.py")):
        if module.name != "__init__.py":
            shutil.copyfile(module, code / module.name)
    (code / "generate.py").write_text(GENERATE_PY.format(method=manifest["method"]))
    (code / "exported_files.py").write_text(embedded_source(files))
    (code / "requirements.txt").write_text(REQUIREMENTS)
    (folder / "README.md").write_text(readme(manifest))


def embedded_files(folder: Path) -> dict[str, str]:
    """FILES of a written custom_generate/exported_files.py, read as a Python literal."""
    tree = ast.parse((folder / "custom_generate" / "exported_files.py").read_text())
    assigned = next(n for n in tree.body if isinstance(n, ast.Assign))
    return ast.literal_eval(assigned.value)


ABOUT = {
    "sprinter": "SPRINTER Alg. 2 (lossy by design): the draft runs while the verifier's score "
    "is >= tau; the target checks only the token the verifier rejects (kept with min(1, p/q), "
    "else redrawn from norm(max(0, p - q))), so a run the verifier accepts costs no target call.",
    "sd_learned": "speculative sampling (lossless) whose drafting length the verifier chooses: "
    "the next draft is drawn while the goodput estimated from its calibrated P(accept) and the "
    "latency profile rises; every drawn draft is verified.",
    "svip": "SVIP (lossless): draft until sqrt(c H_q) > h, H_q the draft's entropy; every "
    "drawn draft is verified. Nothing learned: the folder holds only its settings.",
    "sv": "SV §5, exact (lossless): before each draft, its gain P(accept | S) times the "
    "product of the refined acceptances P(accept | S, A) of the drafts before it, from SV's "
    "table; draw while the goodput estimated with the latency profile rises. Needs the "
    "companion model the table was fitted with.",
}


def latency_note(manifest: dict[str, Any]) -> str:
    where = manifest.get("latency_measured_on")
    if where is None:
        return ""
    return (
        f"- The latency profile was measured on {where}: on another machine the planned lengths\n"
        "  are off (not the output law); pass `latency=` a profile of yours.\n"
    )


def load_line(variable: str, entry: dict[str, Any]) -> str:
    """`variable = AutoModelForCausalLM.from_pretrained(...)` for a model of the manifest."""
    where = entry.get("load") or {}
    args = [repr(str(where.get("path", entry.get("name"))))]
    if where.get("gguf_file"):
        args.append(f"gguf_file={where['gguf_file']!r}")
    if where.get("remote_code"):
        args.append("trust_remote_code=True")
    return f"{variable} = AutoModelForCausalLM.from_pretrained({', '.join(args)})"


def readme(manifest: dict[str, Any]) -> str:
    """The folder's README: what it runs, its usage, what it holds, its limits."""
    method, models = manifest["method"], manifest["models"]
    target, draft, companion = models["target"], models["draft"], models["companion"]
    loads = [load_line("target", target), load_line("draft", draft)]
    if companion is not None:
        loads.append(load_line("companion", companion))
    where = target.get("load") or {}
    tokenizer_args = repr(str(where.get("path", target["name"])))
    if where.get("gguf_file"):
        tokenizer_args += f", gguf_file={where['gguf_file']!r}"
    pair = "assistant_model=draft" + ("" if companion is None else ", companion_model=companion")
    files = [f"`{name}`" for name in manifest["files"].values() if name]
    held = ", ".join(files) if files else "no predictor files (nothing learned)"
    sources = ", ".join(f"{k}: `{v}`" for k, v in manifest["sources"].items())
    settings = ", ".join(f"{k}={v!r}" for k, v in manifest["settings"].items())
    sampling = ", ".join(f"{k} {v}" for k, v in manifest["sampling"].items())
    companion_named = "" if companion is None else f" and the companion `{companion['name']}`"
    newline = "\n"
    return f"""# {method} for Hugging Face `generate`

{ABOUT[method]}

Exported from experiment `{manifest["experiment"]}` with
`python -m sprinter_train stage=export experiment={manifest["experiment"]} export.method={method}`
({manifest["code_version"]}, transformers {manifest["transformers_version"]}).
Settings: {settings or "none"}.

## Usage

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained({tokenizer_args})
{newline.join(loads)}
inputs = tokenizer("Write a haiku about speculative decoding.", return_tensors="pt")
out = target.generate(**inputs, custom_generate="<this folder>", trust_remote_code=True,
                      {pair}, max_new_tokens=64)
print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:]))
```

Greedy by default; `do_sample=True` with `temperature`, `top_k`, `top_p` samples (the
experiment sampled with {sampling}). `return_dict_in_generate=True` also returns the run's
counts (rounds, drafted, accepted, forwards per model). A setting above can be overridden in the
call (`max_gamma=4`; `latency="<a latency.json>"` to plan with your machine's timings). Nothing
from sprinter_train is imported at run time; with sprinter_train installed the same method is
`custom_generate=sprinter_train.hf.{method}` with the predictors as arguments (see its docstring).

## What is here

- `export.json`: the method, its settings, the files below and the models it was made for.
- {held}: the experiment's files, byte for byte ({sources or "none"}).
- `custom_generate/generate.py`: the entry transformers loads; the other modules are
  sprinter_train/hf copied verbatim; `exported_files.py` holds the files above in base64
  (transformers copies only Python files into its module cache); `requirements.txt`.

## Limits

- One sequence at a time (batch size 1, no padding): a batch raises an error.
- Made for the draft `{draft["name"]}` ({draft["model_type"]}, vocabulary {draft["vocab_size"]},
  hidden size {draft["hidden_size"]}){companion_named}: another model is refused with
  `ModelMismatchError` (parameter layout and sampled weights are compared; bfloat16 or float16
  copies of the same weights pass).
{latency_note(manifest)}- Sampling is temperature, top-k and top-p only; other logits processors, beams and scores
  are refused (p and q must be warped alike for speculative sampling to stay exact).
"""
