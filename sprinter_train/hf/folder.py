"""Writes an export folder: its predictor files and export.json, README.md, and
custom_generate/ with generate.py, the package's modules the methods import (vendor.py), the
predictor files embedded in exported_files.py and requirements.txt.

    checkpoints/<exp>/export-<method>/
        export.json, the predictor files, README.md
        custom_generate/generate.py         the entry transformers loads
        custom_generate/hf__methods.py ...  sprinter_train's modules, flat (vendor.py)
        custom_generate/exported_files.py   the files above in base64
        custom_generate/requirements.txt
"""

from __future__ import annotations

import ast
import base64
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sprinter_train.hf.bundle import Bundle
from sprinter_train.hf.methods import METHODS
from sprinter_train.hf.vendor import REQUIRED, flat_name, vendor

ENTRY = "sprinter_train.hf.methods"  # what generate.py imports; vendor.py follows its imports
GENERATE_PY = '''"""custom_generate entry of a sprinter_train export ({method}), written by stage=export.

    out = target.generate(**inputs, custom_generate="<this folder>", trust_remote_code=True,
                          assistant_model=draft, max_new_tokens=64)
"""

from .exported_files import FILES
from .{entry} import exported_generate


def generate(model, **kwargs):
    """Decode one sequence with {method} and this folder's predictors."""
    return exported_generate(model, FILES, **kwargs)
'''
VERSIONS = {"transformers": ">=5.17,<6"}
REQUIREMENTS = "".join(f"{name}{VERSIONS.get(name, '')}\n" for name in REQUIRED)


def write_folder(out: Path, files: dict[str, bytes], manifest: dict[str, Any]) -> list[str]:
    """Write the folder beside `out`, load it back (folder and embedded copy), then swap it in;
    a failure leaves no partial folder and the previous export as it was. The folder written
    aside is this process's own (two exports at once never share one)."""
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        fill(tmp, files, manifest)
        for bundle in (Bundle.from_folder(tmp), Bundle.from_embedded(embedded_files(tmp))):
            bundle.arguments()  # every predictor parses
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out.with_name(f".{out.name}.old{os.getpid()}")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def fill(folder: Path, files: dict[str, bytes], manifest: dict[str, Any]) -> None:
    """The predictor files and export.json, README.md, and custom_generate/: generate.py,
    the modules `ENTRY` imports (vendor.py), the embedded files, requirements.txt."""
    code = folder / "custom_generate"
    code.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    vendor([ENTRY], code)
    entry = flat_name(ENTRY)
    (code / "generate.py").write_text(GENERATE_PY.format(method=manifest["method"], entry=entry))
    (code / "exported_files.py").write_text(embedded_source(files))
    (code / "requirements.txt").write_text(REQUIREMENTS)
    (folder / "README.md").write_text(readme(manifest))


def embedded_files(folder: Path) -> dict[str, str]:
    """FILES of a written custom_generate/exported_files.py, read as a Python literal."""
    tree = ast.parse((folder / "custom_generate" / "exported_files.py").read_text())
    assigned = next(n for n in tree.body if isinstance(n, ast.Assign))
    return ast.literal_eval(assigned.value)


def embedded_source(files: Mapping[str, bytes]) -> str:
    """custom_generate/exported_files.py for these files (export.json among them)."""
    lines = [
        '"""The export folder\'s files, base64: transformers copies only Python files into its',
        'module cache, so generate.py reads its predictors from here (written by stage=export)."""',
        "",
        "FILES = {",
    ]
    for name in sorted(files):
        lines.append(f"    {name!r}: {base64.b64encode(files[name]).decode('ascii')!r},")
    lines.append("}")
    return "\n".join(lines) + "\n"


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
    decoding = ", ".join(f"{k}={v!r}" for k, v in manifest["decoding"].items())
    newline = "\n"
    return f"""# {method} for Hugging Face `generate`

{METHODS[method].__doc__}

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

- `export.json`: the method, its settings, the files below, the models it was made for and
  the decoding settings its engine runs with ({decoding}).
- {held}: the experiment's files, byte for byte ({sources or "none"}).
- `custom_generate/generate.py`: the entry transformers loads; the other modules are
  sprinter_train's own, copied with their imports made relative (`decoding__engine.py` is
  sprinter_train/decoding/engine.py): the engine, the method's policy, the predictors' readers
  and the adapter to `generate` (`hf__*.py`); `exported_files.py` holds the files above in
  base64 (transformers copies only Python files into its module cache); `requirements.txt`.

## Limits

- One sequence at a time (batch size 1, no padding): a batch raises an error. Target, draft
  and companion on one device.
- Made for the draft `{draft["name"]}` ({draft["model_type"]}, vocabulary {draft["vocab_size"]},
  hidden size {draft["hidden_size"]}){companion_named}: another model is refused with
  `ModelMismatchError` (parameter layout and sampled weights are compared; bfloat16 or float16
  copies of the same weights pass).
{latency_note(manifest)}- Sampling is temperature, top-k and top-p only; other logits processors, beams and scores
  are refused (p and q must be warped alike for speculative sampling to stay exact).
"""
