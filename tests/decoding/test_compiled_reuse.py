"""A shape one method compiled is reused by every other method on the same compiled engine.

The bench warms its methods up one after another on one engine, after the latency profile
and the hf_static peer's warm-up. The runners' compiled step must then compile nothing again
for a shape it has compiled, whichever method drives it and whatever ran in between: a
recompile of a known shape is counted as compile time, but it costs the warm-up a compile
per graph, and on a GPU each graph captured anew.

The graphs are traced by dynamo with its `eager` backend: the guards, and so the
recompiles, are dynamo's, without inductor's code generation (a compile in seconds).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from sprinter_train.core.compile_cache import step_of_its_own
from sprinter_train.decoding.builder import build_engine
from sprinter_train.decoding.policies import (
    SVIP,
    SpeculativeDecoding,
    SpecVerification,
    Sprinter,
    TargetOnly,
)
from sprinter_train.decoding.runner import backends
from sprinter_train.decoding.runner import capture as graphs
from sprinter_train.models.cache import with_cache
from tests.decoding_helpers import (
    PACK_EVERY,
    PROMPTS,
    SAMPLING,
    VOCAB,
    ATable,
    fixed_timings,
    tiny_trio,
)

NEW_TOKENS = 12


def new_model_type() -> torch.nn.Module:
    """A model of a type made on the spot: looking its cache argument up adds a type to the
    process-wide memo (`models.cache.cache_kwarg`), as the hf_static peer's warm-up adds
    its target's."""

    class PeerModel(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, cache: Any = None) -> torch.Tensor:
            return input_ids

    return PeerModel()


def dynamo_only(
    body: Any, device: torch.device, reduce_overhead: bool = False, folder: Any = None
) -> Any:
    """`compiled.compiled_step` with no compile-cache folder, on dynamo's `eager` backend:
    the same guards and recompiles, no inductor; a code object of its own, as the plain
    compile's (dynamo keeps its graphs per code object, and every `StaticBody` shares one)."""
    own = step_of_its_own(body.forward, "compiled reuse")
    return torch.compile(own, fullgraph=True, dynamic=None, backend="eager")


@pytest.fixture
def eager_dynamo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Compiled runners built while it is active trace with dynamo alone, their graphs
    replayed as captured ones played on the CPU (`graphs.HostGraph`), as the GPU's
    `compiled:captured` layout replays them; dynamo's recompile limits raised as
    `compiled_step` raises them (through its own `patch`: a monkeypatch of dynamo's config
    module hides the setting once undone)."""
    monkeypatch.setattr(backends, "compiled_step", dynamo_only)
    monkeypatch.setattr(graphs, "CudaGraph", graphs.HostGraph)
    config = torch._dynamo.config
    limits = {
        "recompile_limit": max(config.recompile_limit, 256),
        "accumulated_recompile_limit": max(config.accumulated_recompile_limit, 256),
    }
    with config.patch(limits):
        yield


@pytest.mark.heavy  # dynamo traces every method's shapes of three models, prefills included
def test_sprinter_reuses_the_shapes_the_other_methods_compiled(eager_dynamo, caplog) -> None:
    """target_only, sd, svip and sv compile the target's blocks; then, as the bench's
    hf_static peer does, another model type has its cache argument looked up; sprinter's
    target forwards (a warp without a draw or a check: new captured graphs over the same
    compiled body) compile nothing for a shape already compiled."""
    models = tiny_trio()
    engine = build_engine(
        models["target"],
        SAMPLING,
        VOCAB,
        draft=models["draft"],
        companion=models["companion"],
        layout={"static": True, "compiled": True, "captured": True},
        pack_every=PACK_EVERY,
        timings=fixed_timings(),
    )
    assert all(r.layout == "compiled:captured" for r in engine.present_runners.values())
    parity = Sprinter(lambda e, b, r, step: (step.tokens % 2).float(), tau=0.5, max_run=16)
    first = [TargetOnly(), SpeculativeDecoding(gamma=3), SVIP(h=0.25, max_gamma=4, c=0.15)]
    first.append(SpecVerification(ATable(), max_gamma=4))
    with caplog.at_level(logging.WARNING, logger="sprinter_train.decoding.runner.clock"):
        for method in first:
            engine.generate([PROMPTS[0]], method, NEW_TOKENS)
        with_cache(new_model_type(), None)  # as the hf_static peer looks its target's name up
        graphs_before = backends.compiled_graphs()
        engine.generate([PROMPTS[0]], parity, NEW_TOKENS)
    assert "recompiled a shape" not in caplog.text
    target = engine.present_runners["target"]
    assert target.graphs is not None and target.compiles >= 1
    widths = {key[1] for key in target.backend.static._shapes_seen}
    assert {1, 2, 3, 4} <= widths  # sprinter's target blocks are among the known widths
    assert backends.compiled_graphs() == graphs_before  # sprinter compiled nothing
