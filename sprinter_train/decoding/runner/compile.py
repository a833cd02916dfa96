"""How a static layout's step is compiled: which dimensions are symbolic, and where its
graphs are kept for the next process.

With a compile-cache folder in the runner's layout (`decoding.compile_cache`,
`core.compile_cache.CompileCache`, resolved by `decoding.builder`), a step's graphs are saved whole with their guards (`core.precompiled.PrecompiledStep`), in a
folder of their own named after everything that decides them but is not among the saved
guards (`step_identity`): a later process loads and runs them without tracing. Without
one, and under `reduce-overhead` (which records its CUDA graphs in the process), the step
is a plain `torch.compile`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

import torch
import transformers

from sprinter_train.core.compile_cache import step_of_its_own
from sprinter_train.core.precompiled import PrecompiledStep
from sprinter_train.models.body import StaticBody

# what changes from call to call in a run, symbolic in a compiled step from its first call
# (dynamo's sources, in `StaticBody.forward`'s own names): the row bucket, the block's width,
# the attention span and the mask as long, and the buffers' capacity. A size of one stays a
# shape of its own (dynamo specialises it): one graph for one-token blocks, one past them; a
# bucket of one row, which a compiled runner on a GPU never uses (`StaticRowCache`'s
# `shrink`), likewise
SYMBOLIC = ",".join(
    (
        "L['ids']:0",
        "L['ids']:1",
        "L['positions']:0",
        "L['positions']:1",
        "L['mask']:0",
        "L['kv'].span",
        "L['mask']:1",
        *(
            rf"L\['kv'\]\.layers\[\d+\]\.{part}:{dim}"
            for part in ("keys", "values")
            for dim in (0, 2)
        ),
    )
)
# the modules whose code a static step traces, beside the model's own classes
TRACED = (
    "sprinter_train.models.body",
    "sprinter_train.models.cache",
    "sprinter_train.models.packed",
    "sprinter_train.models.weight_packing",
    "sprinter_train.decoding.cache.static",
)


def shape_owner(model: torch.nn.Module, hidden_layer: int) -> str:
    """What decides a model's step's shapes, as a name (`step_of_its_own`): its class, the
    config's sizes and the hidden state it hands verifiers. Two models alike in all of them
    (a target and its companion copy) may share one record of shapes."""
    config = getattr(model, "config", None)
    sizes = [
        getattr(config, key, None)
        for key in (
            "model_type",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
        )
    ]
    dtype = next(model.parameters()).dtype
    return repr((type(model).__name__, *sizes, str(dtype), hidden_layer))


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (those compiled to be saved too)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def device_kind(device: torch.device) -> str:
    """The device a compiled graph's kernels were built for: the GPU's name and compute
    capability, or the CPU's vector instruction set inductor compiles for."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return f"cuda:{name}:{torch.cuda.get_device_capability(device)}"
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return f"{device.type}:{pick_vec_isa()}"


def source_digest(modules: list[Any]) -> str:
    """A hash of the source files of `modules` (module objects or classes)."""
    digest = hashlib.sha1()
    for name in sorted({inspect.getsourcefile(m) or "" for m in modules}):
        digest.update(name.encode())
        if name:
            digest.update(Path(name).read_bytes())
    return digest.hexdigest()


def step_identity(body: StaticBody, device: torch.device) -> tuple[str, ...]:
    """What decides a static step's graphs but is not among their saved guards (those on
    objects' identities and on globals are dropped, `core.precompiled`): the model's
    architecture and sizes, the classes of its modules (prepacked linears or not), its
    attention implementation, the device kind, the transformers version and the source of
    every file traced. Torch's version names the cache folder above."""
    model = body.model
    classes = sorted({f"{type(m).__module__}.{type(m).__qualname__}" for m in model.modules()})
    traced = [importlib.import_module(name) for name in TRACED]
    traced += [sys.modules[type(m).__module__] for m in model.modules()]
    return (
        shape_owner(model, body.hidden_layer),
        ",".join(classes),
        str(getattr(model.config, "_attn_implementation", None)),
        device_kind(device),
        transformers.__version__,
        source_digest(traced),
    )


def step_folder(body: StaticBody, device: torch.device, folder: Path) -> Path:
    """Where a static step's saved graphs live in the compile-cache `folder`:
    `steps/<hash of step_identity>`."""
    name = hashlib.sha1(repr(step_identity(body, device)).encode()).hexdigest()[:16]
    return folder / "steps" / name


def compiled_step(
    body: StaticBody, device: torch.device, reduce_overhead: bool, folder: Path | None
) -> Any:
    """`body` compiled (`fullgraph`): the dimensions every run changes (`SYMBOLIC`) symbolic
    from the first call, so the bucketed shapes share two graphs (one-token blocks, and past
    them) and compile faster than one graph per shape, with the same tokens.

    - With a compile-cache `folder`: a `PrecompiledStep`, whose graphs a later process
      loads instead of tracing them.
    - Otherwise, or under `reduce-overhead` (`reduce_overhead`, CUDA only; it records one
      CUDA graph per concrete shape in the process): a plain `torch.compile` with dynamo's
      automatic dynamic shapes, on a code object of the model's own (`step_of_its_own`), its
      recompile limit raised to cover the shapes.

    On a CPU the linears call the eager path's prepacked oneDNN weights through one custom
    op (`models.packed.packed_linear`) at any row count: inductor's own packing (`freezing`)
    needs a static row dimension, which the symbolic graphs lack, and without it small
    verify blocks fall back to a slow matmul path (docs/results/design-figures.md).
    Both switches come resolved in the runner's layout (`runner.layout.RunnerLayout`): a
    captured layout (`capture.CapturedBackend`, the default on a GPU) compiles without
    `reduce-overhead` and records the graphs itself."""
    limit = 256  # row buckets x widths x capacities of a run stay far below this
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, limit)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, limit)
    compiler = torch.compiler.config
    if SYMBOLIC not in compiler.dynamic_sources:
        compiler.dynamic_sources = ",".join(x for x in (compiler.dynamic_sources, SYMBOLIC) if x)
    if reduce_overhead:
        return plain_step(body, reduce_overhead=True)
    if folder is None:
        return plain_step(body, reduce_overhead=False)
    steps = step_folder(body, device, folder)  # hashes the traced sources: only where read
    plain = functools.partial(plain_step, body, False)
    return PrecompiledStep(body, steps, compiler.dynamic_sources, plain=plain)


def plain_step(body: StaticBody, reduce_overhead: bool) -> Any:
    """`body` under a plain `torch.compile` (`reduce_overhead`: replayed as CUDA graphs),
    on a code object of the model's own: dynamo keeps its graphs, its recompile count and
    its record of changing dimensions per code object, which every `StaticBody` shares."""
    own = step_of_its_own(body.forward, shape_owner(body.model, body.hidden_layer))
    mode = "reduce-overhead" if reduce_overhead else None
    return torch.compile(own, fullgraph=True, dynamic=None, mode=mode)
