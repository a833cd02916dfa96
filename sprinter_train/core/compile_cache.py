"""torch.compile's caches on disk, kept in one folder every process of a machine reads.

Inductor keeps the kernels and graphs it generated (its FX-graph cache, and AOTAutograd's
cache of the traced graph) on disk, keyed by the graph, the torch version and the device, so
a later process that traces the same graph skips code generation and the C++/Triton builds:
most of a compile. By default that folder is a temporary one (`/tmp/torchinductor_<user>`),
which a fresh machine or container starts without. `decoding.compile_cache` names a
folder that outlives them (default: the user's cache folder), which `gpu_bench.sh` can carry
from one machine to the next; `null` turns the on-disk caches off. Every stage reports what it
compiled and how much of it the cache served (`compile_record`).

The same folder keeps dynamo's record of which dimensions it found changing (its profile-guided
state, kept per code object under a job id): a later process compiles those dimensions symbolic
from the first call instead of a static graph first and the symbolic one on the next shape,
so it traces fewer frames, and tracing is most of what a warm start still pays. A compiled
step of its own per model (`step_of_its_own`) keeps one model's record from another's.

The folder also holds the decoding step's graphs saved whole, with their guards
(`core.precompiled`, under `steps/`): a later process loads and runs those without tracing.
Results: docs/results/compile-cpu.md.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sprinter_train.core.validation import ConfigError

log = logging.getLogger(__name__)
ENV = "TORCHINDUCTOR_CACHE_DIR"  # inductor reads it at every cache look-up
# counters dynamo keeps per process: (group, key) of each cache's hits and misses
# (the saved graphs of `core.precompiled` count theirs under "precompiled")
HITS = (
    ("inductor", "fxgraph_cache_hit"),
    ("aot_autograd", "autograd_cache_hit"),
    ("precompiled", "hit"),
)
MISSES = (
    ("inductor", "fxgraph_cache_miss"),
    ("aot_autograd", "autograd_cache_miss"),
    ("precompiled", "miss"),
)
JOB = "sprinter_train"  # dynamo keeps its profile-guided state only under a job id


def default_folder() -> Path:
    """The user's cache folder ($XDG_CACHE_HOME, else ~/.cache) / sprinter_train / compile."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sprinter_train" / "compile"


def cache_folder(setting: Any) -> Path | None:
    """`decoding.compile_cache`: `auto` is `default_folder()`, a path is itself (`~`
    expanded), null (or an empty string) none. One subfolder per torch version: another
    version never reads this one's kernels, and an upgrade leaves the old ones to delete."""
    if setting is None or str(setting).strip() == "":
        return None
    folder = default_folder() if str(setting) == "auto" else Path(str(setting)).expanduser()
    return folder.resolve() / f"torch-{torch.__version__}"


def use_compile_cache(setting: Any) -> Path | None:
    """Point inductor's on-disk caches at the folder `setting` names, or turn them off; call
    before the process compiles anything. Returns the folder in use."""
    cache = CompileCache(cache_folder(setting), setting)
    cache.point(sweep=True)
    return cache.folder


@dataclass(frozen=True)
class CompileCache:
    """`decoding.compile_cache` resolved: the folder torch's on-disk caches and the saved
    steps (`core.precompiled`, under `steps/`) live in, or None: the on-disk caches off.
    Part of a compiled runner's layout (`decoding.builder`), which points the process at it
    when it builds the runner (`apply`), so every caller of the builder gets it alike and
    the folder travels with the layout, not through a process-wide setting of ours."""

    folder: Path | None
    setting: Any = field(default=None, compare=False)  # as written, for the error messages

    def apply(self) -> None:
        """Point torch at this cache unless it points there already: inductor's and
        AOTAutograd's caches, the environment inductor reads and dynamo's record of changing
        dimensions, all process-wide torch settings; the first time, the folder is made and
        swept of the shared objects a killed compile cut short."""
        self.point(sweep=not self.in_place())

    def in_place(self) -> bool:
        """Whether torch's caches point at this one already."""
        from torch._inductor import config as inductor_config

        on = self.folder is not None
        if bool(inductor_config.fx_graph_cache) != on:
            return False
        return not on or os.environ.get(ENV) == str(self.folder)

    def point(self, sweep: bool) -> None:
        """Point torch's caches here; `sweep`: make and check the folder and sweep it."""
        from torch._functorch import config as functorch_config
        from torch._inductor import config as inductor_config

        folder = self.folder
        if folder is not None and sweep:
            writable_folder(folder, self.setting if self.setting is not None else folder)
        inductor_config.fx_graph_cache = folder is not None
        functorch_config.enable_autograd_cache = folder is not None
        use_shape_record(folder is not None)
        if folder is not None:
            os.environ[ENV] = str(folder)
            for path in sweep_truncated(folder) if sweep else ():
                log.warning("compile cache: removed %s, cut short by a killed compile", path)


def use_shape_record(on: bool) -> None:
    """Let dynamo keep and read its record of changing dimensions (under `JOB`, in the
    cache folder), or stop it; a job id the user set is theirs and left alone."""
    config = torch.compiler.config
    if on and config.job_id is None:
        config.job_id = JOB
    elif not on and config.job_id == JOB:
        config.job_id = None


def step_of_its_own(method: Any, owner: str) -> Any:
    """The bound `method` with a code object of its own, named after `owner`: dynamo keeps its
    graphs, its recompile count and its record of changing dimensions per code object (the
    record keyed by file, line and name), so the target's step and a draft's, one method
    otherwise, would merge the shapes each has seen (a draft's hidden size taken for a
    dimension that changes) and compile graphs neither needs."""
    function = method.__func__
    tag = hashlib.sha1(owner.encode()).hexdigest()[:12]
    name = f"{function.__name__}_{tag}"
    code = function.__code__.replace(co_name=name, co_qualname=f"{function.__qualname__}_{tag}")
    own = types.FunctionType(
        code, function.__globals__, name, function.__defaults__, function.__closure__
    )
    own.__doc__, own.__wrapped__ = function.__doc__, function
    return types.MethodType(own, method.__self__)


def writable_folder(folder: Path, setting: Any) -> None:
    """Make `folder` and check this process may write there, or fail naming the setting: a
    cache that cannot be written would fail in the middle of the first compile."""
    remedy = "name a folder this user can write, or null to turn the compile cache off"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ConfigError(
            f"decoding.compile_cache={setting}: cannot make {folder} ({reason}); {remedy}"
        ) from error
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(
            f"decoding.compile_cache={setting}: {folder} is not writable by this user; {remedy}"
        )


def truncated_elf(path: Path) -> bool:
    """Whether a shared object ends before its ELF header says it does: a C++ build killed
    mid-write (a stage past its time limit) leaves one, and inductor loads it by its key
    ("file too short") instead of building it again."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        header = handle.read(64)
    if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2:  # 64-bit only
        return True
    order = "<" if header[5] == 1 else ">"
    section_offset = struct.unpack_from(order + "Q", header, 0x28)[0]
    entry_size, entries = struct.unpack_from(order + "HH", header, 0x3A)
    return section_offset + entry_size * entries > size


def sweep_truncated(folder: Path) -> list[Path]:
    """Delete the cut-short shared objects under `folder` (inductor builds them anew)."""
    removed = []
    for path in folder.rglob("*.so"):
        if path.is_file() and truncated_elf(path):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def compile_counters() -> dict[str, int]:
    """This process's cache hits and misses so far (both caches summed)."""
    from torch._dynamo.utils import counters

    return {
        "hits": sum(counters[group][key] for group, key in HITS),
        "misses": sum(counters[group][key] for group, key in MISSES),
    }


def note_precompiled(hits: int = 0, misses: int = 0, loaded: int = 0, seconds: float = 0.0) -> None:
    """Count what `core.precompiled` loaded from the folder, ran of it (hits), compiled
    (misses), and the seconds it spent loading and compiling, beside dynamo's own tallies:
    its loads and compiles go through neither dynamo's frame timer nor inductor's cache
    counters."""
    from torch._dynamo.utils import counters

    counters["precompiled"]["loaded"] += loaded
    counters["precompiled"]["hit"] += hits
    counters["precompiled"]["miss"] += misses
    _PRECOMPILED_SECONDS[0] += seconds


_PRECOMPILED_SECONDS = [0.0]  # this process's, see `note_precompiled`


def loaded_graphs() -> int:
    """Graphs this process has loaded from a compile-cache folder (`note_precompiled`)."""
    from torch._dynamo.utils import counters

    return int(counters["precompiled"]["loaded"])


def dynamo_seconds() -> float:
    """Seconds this process has spent compiling so far: dynamo's frames (its own tally) and
    the saved graphs' loads and compiles (`note_precompiled`)."""
    from torch._dynamo.utils import calculate_time_spent

    frames = float(calculate_time_spent().get("entire_frame_compile", 0.0))
    return frames + _PRECOMPILED_SECONDS[0]


def compile_record(before: dict[str, int], seconds: float) -> dict[str, Any]:
    """What a run compiled since `before` (a `compile_counters()`): the seconds its compiles
    took, the cache look-ups served from disk and those compiled anew, and the folder."""
    now = compile_counters()
    hits, misses = now["hits"] - before["hits"], now["misses"] - before["misses"]
    return {
        "seconds": round(float(seconds), 3),
        "cache_folder": os.environ.get(ENV),
        "cache_hits": hits,
        "cache_misses": misses,
        "cache_hit": hits > 0 and misses == 0,
    }
