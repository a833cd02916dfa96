"""The static KV layout (`decoding.static_cache`) and its compiled forward (`decoding.compile`).

The static layout must not change a single token: every method of the registry emits, greedy
and sampled with the same seeds, exactly what the dynamic `RowCache` layout emits (float32),
while rows finish at different rounds (EOS), the row bucket shrinks, and the capacity fills,
packs and grows. The compiled forward must trace into one graph at every shape bucket and
emit the eager tokens.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from sprinter_train.bench.timing.latency import measure_runner_times
from sprinter_train.core.compile_cache import CompileCache, cache_folder, step_of_its_own
from sprinter_train.core.config import compose_config
from sprinter_train.core.sampling import inverse_cdf, warp_probs
from sprinter_train.decoding.batch import Round
from sprinter_train.decoding.builder import (
    build_engine,
    build_runner,
    decoding_problems,
    runner_layout,
)
from sprinter_train.decoding.cache import shapes as static_shapes
from sprinter_train.decoding.cache import static as static_cache
from sprinter_train.decoding.cache.static import (
    SlotMappedKV,
    StaticRowCache,
    attention_span,
    capacity_bucket,
    row_bucket,
)
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import (
    MTAD,
    SVIP,
    AdaEDL,
    HeuristicSD,
    SpeculativeDecoding,
    SpecVerification,
    SpecVerificationPaper,
    Sprinter,
    TargetOnly,
)
from sprinter_train.decoding.policies.online import OnlineLength
from sprinter_train.decoding.policies.oracle import OracleLength
from sprinter_train.decoding.policies.registry import method_class
from sprinter_train.decoding.policies.typical import TypicalAcceptance
from sprinter_train.decoding.runner import backends
from sprinter_train.decoding.runner import capture as graphs
from sprinter_train.decoding.runner import runner as runner_module
from sprinter_train.decoding.runner.after_warp import Draw
from sprinter_train.decoding.runner.clock import ForwardClock
from sprinter_train.decoding.runner.compile import SYMBOLIC
from sprinter_train.decoding.runner.requests import ForwardRequest
from sprinter_train.decoding.runner.runner import ModelRunner, prefill_groups
from sprinter_train.models import body as body_module
from sprinter_train.models.packed import pack_linears
from sprinter_train.stages.settings import config_problems
from tests.decoding_helpers import (
    GREEDY,
    PACK_EVERY,
    PREFILL_TOKENS,
    PROMPTS,
    RUNS,
    SAMPLING,
    VOCAB,
    ATable,
    assert_target_law_with_power,
    engine_for,
    first_tokens,
    fixed_timings,
    ragged_rows,
    tiny_trio,
)
from tests.sd_learned_helpers import before_draw

# the sampled variant stays in make test; the quick loop keeps the greedy one
SAMPLED_HEAVY = [GREEDY, pytest.param(SAMPLING, marks=pytest.mark.heavy)]
ROWS = PROMPTS * 2  # 8 rows: the row bucket shrinks 8 -> 4 -> 2 -> 1 as rows finish
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def models() -> dict[str, torch.nn.Module]:
    return tiny_trio()


def engine(models, sampling, eos: int | None, **layout: bool) -> Engine:
    """The trio's engine with every runner in the given layout (`static`, `compiled`,
    `padded_prefill`)."""
    return engine_for(models, sampling, layout=layout, eos=eos)


@pytest.fixture(scope="module")
def eos(models) -> int:
    """A token the first prompt's greedy continuation reaches mid-way: rows stop at it at
    different rounds, so finished rows leave a batch of several buckets."""
    tokens = engine(models, GREEDY, None).generate([PROMPTS[0]], TargetOnly(), NEW_TOKENS)
    return tokens[0].tokens[NEW_TOKENS // 3]


def every_method(models) -> list:
    """One policy of each class the registry's methods name (conf/methods)."""
    parity = Sprinter(lambda e, b, r, step: (step.tokens % 2).float(), tau=0.5, max_run=5)
    online = dict(compose_config().methods.sd_online.online)
    return [
        TargetOnly(),
        SpeculativeDecoding(gamma=3),
        HeuristicSD(gamma_init=2),
        SVIP(h=0.25, max_gamma=4, c=0.15),
        AdaEDL(gamma=0.3, lam=0.4, max_gamma=4),
        SpecVerification(ATable(), max_gamma=4),
        SpecVerificationPaper(ATable(), max_gamma=4),
        parity,
        MTAD(gamma=3, beam_width=3, tau=0.5),
        TypicalAcceptance(gamma=3, epsilon=0.1),
        OnlineLength(max_gamma=4, online={**online, "refit_interval": 8}),
        before_draw(models),
        OracleLength(max_gamma=4),
    ]


def test_every_registry_method_is_covered(models) -> None:
    methods = compose_config().methods
    registry = {method_class(node, name) for name, node in methods.items()}
    assert registry == {type(policy) for policy in every_method(models)}


@pytest.mark.parametrize("sampling", SAMPLED_HEAVY, ids=["greedy", "sampled"])
def test_static_layout_emits_the_dynamic_layouts_tokens_for_every_method(
    models, eos, sampling
) -> None:
    ragged = 0
    for fresh, again in zip(every_method(models), every_method(models), strict=True):
        dynamic = engine(models, sampling, eos).generate(ROWS, fresh, NEW_TOKENS)
        static = engine(models, sampling, eos, static=True)
        caches = static.new_batch(ROWS, 1, range(len(ROWS))).caches
        assert all(isinstance(cache, StaticRowCache) for cache in caches.values())
        out = static.generate(ROWS, again, NEW_TOKENS)
        assert [r.tokens for r in out] == [r.tokens for r in dynamic], fresh.name
        ragged += len({len(r.tokens) for r in dynamic}) > 1  # rows left at different rounds
    assert ragged >= len(every_method(models)) // 2


def test_a_full_cache_packs_early_and_grows_without_changing_tokens(models, monkeypatch) -> None:
    """At a capacity bucket of 8 slots the buffers fill within a round or two: the engine packs
    when `crowded` and `reserve` grows the buffers past a bucket."""
    monkeypatch.setattr(static_shapes, "MIN_CAPACITY", 8)
    # the buffers start at 8 slots (prompt + budget would ask for 47)
    monkeypatch.setattr("sprinter_train.decoding.loop.CAPACITY_SLACK", -40)
    dynamic = engine(models, SAMPLING, None).generate(ROWS, SVIP(0.25, 4, 0.15), 40)
    static = engine(models, SAMPLING, None, static=True)
    grown = []
    reserve = StaticRowCache.reserve

    def spy(cache: StaticRowCache, width: int) -> None:
        before = cache.capacity
        reserve(cache, width)
        if cache.capacity != before:
            grown.append((before, cache.capacity))

    monkeypatch.setattr(StaticRowCache, "reserve", spy)
    out = static.generate(ROWS, SVIP(0.25, 4, 0.15), 40)
    assert [r.tokens for r in out] == [r.tokens for r in dynamic]
    assert grown[0][0] == 8 and len(grown) >= 2  # the capacity really ran out, twice


def test_the_next_generation_reuses_the_buffers_zeroed(models) -> None:
    """A finished cache's buffers go back to the runner's pool and the next cache of that
    shape gets the same addresses (what a recorded CUDA graph needs), cleared."""
    runner = build_runner(models["target"], VOCAB, {"static": True, "min_capacity": 100})
    first = runner.new_cache(3, 10)
    assert first.capacity == capacity_bucket(100) and first.bucket == 4
    address = first.kv.layers[0].keys.data_ptr()
    with torch.inference_mode():
        first.kv.layers[0].keys.fill_(float("nan"))
    del first
    again = runner.new_cache(4, 20)
    assert again.kv.layers[0].keys.data_ptr() == address
    assert not again.kv.layers[0].keys.isnan().any() and again.kv.layers[0].keys.abs().sum() == 0
    other = runner.new_cache(4, 20)  # the pool's one cache of that shape is in use
    assert other.kv.layers[0].keys.data_ptr() != address


def test_reused_buffers_and_unshrinking_rows_keep_the_tokens(models, eos) -> None:
    """Generations one after another on one engine (pooled buffers) with the row bucket kept
    as rows leave (the compiled layout's choice) emit the dynamic layout's tokens."""
    static = engine(models, SAMPLING, eos, static=True)
    for runner in static.runners.values():
        runner.backend.shrink_rows = False
    buckets = []
    select = StaticRowCache.select

    def spy(cache: StaticRowCache, rows: torch.Tensor) -> None:
        select(cache, rows)
        buckets.append((len(rows), cache.bucket))

    for policy in (TargetOnly(), SpeculativeDecoding(gamma=3), SVIP(0.25, 4, 0.15)):
        dynamic = engine(models, SAMPLING, eos).generate(ROWS, copy.deepcopy(policy), NEW_TOKENS)
        for _ in range(2):
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(StaticRowCache, "select", spy)
                out = static.generate(ROWS, copy.deepcopy(policy), NEW_TOKENS)
            assert [r.tokens for r in out] == [r.tokens for r in dynamic], policy.name
    assert any(rows < 4 for rows, _ in buckets) and {b for _, b in buckets} == {8}
    assert len(static.target.kv_pool) >= 1


@pytest.mark.parametrize("captured", [False, True], ids=["static", "captured"])
def test_a_kept_bucket_runs_one_prompt_in_two_rows_with_its_tokens(
    models, eos, captured, replayed
) -> None:
    """A cache that keeps its row bucket (compiled on a GPU) starts at two rows, so one
    prompt shares the row-symbolic graphs; the inert row changes no token, replayed from
    captured graphs too (CUDA graph semantics played on the CPU)."""
    static = engine(models, SAMPLING, eos, static=True, captured=captured)
    for runner in static.runners.values():
        getattr(runner.backend, "static", runner.backend).shrink_rows = False
    assert static.target.new_cache(1, 10).bucket == 2
    for policy in (TargetOnly(), SpeculativeDecoding(gamma=3), SVIP(0.25, 4, 0.15)):
        dynamic = engine(models, SAMPLING, eos).generate(
            ROWS[:1], copy.deepcopy(policy), NEW_TOKENS
        )
        out = static.generate(ROWS[:1], copy.deepcopy(policy), NEW_TOKENS)
        assert [r.tokens for r in out] == [r.tokens for r in dynamic], policy.name
    assert not captured or replayed.replays > 0


# heavy whole: its one quick case sat at the quick set's CPU budget and crossed it on a loaded machine
@pytest.mark.heavy
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLING], ids=["greedy", "sampled"])
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_a_padded_prefill_emits_the_by_length_prefills_tokens(models, eos, sampling, static):
    """The GPU's prefill (rows right-padded into one forward, no mask; in the static layout
    one block through its step) changes no token of any method: the causal mask hides the
    padding after a prompt from the prompt, and the padded slots are marked empty (float32,
    prompts of four lengths, rows leaving at EOS)."""
    calls = []
    real = runner_module.body

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    for fresh, again in zip(every_method(models), every_method(models), strict=True):
        by_length = engine(models, sampling, eos, static=static)
        padded = engine(models, sampling, eos, static=static, padded_prefill=True)
        expected = by_length.generate(ROWS, fresh, NEW_TOKENS)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(runner_module, "body", counted)  # the model's own forward
            patch.setattr(body_module, "body", counted)  # the static layouts' step
            runner = padded.target
            before = len(calls)
            runner.prime(runner.new_cache(len(ROWS)), [row[:-1] for row in ROWS])
            assert len(calls) - before == 1  # one forward for every prompt
        out = padded.generate(ROWS, again, NEW_TOKENS)
        assert [r.tokens for r in out] == [r.tokens for r in expected], fresh.name


CLOCK_LOG = (
    "sprinter_train.decoding.runner.clock"  # its own level: a stage run may raise the package's
)


def test_one_group_of_prompts_fills_the_static_cache_through_its_step(models, caplog) -> None:
    """Prompts in one group (a GPU's padded prefill) fill the static cache as one block
    through the runner's own step, not the model's own forward and a copy: the same keys and
    values in the filled slots and the same slot map as the by-length prefill (three groups
    here, the eager path); a prompt width that compiles is compile time, unwarned (a prompt
    length is new by nature, not a shape dynamo forgot)."""
    rows = [[3, 5, 7, 9], [4, 6], [8]]
    padded = {"static": True, "padded_prefill": True, "prefill_tokens": PREFILL_TOKENS}
    block = build_runner(models["target"], VOCAB, padded)
    by_length = build_runner(models["target"], VOCAB, {"static": True})
    steps = []
    step = block.backend.step
    block.backend.step = lambda *inputs: (steps.append(1), step(*inputs))[1]
    ours, theirs = block.new_cache(3, 16), by_length.new_cache(3, 16)
    block.prime(ours, rows)
    by_length.prime(theirs, rows)
    assert steps == [1]
    assert ours.slots == theirs.slots == 4 and ours.settled == theirs.settled == 1
    assert torch.equal(ours.position, theirs.position)
    assert torch.equal(ours.lengths, theirs.lengths)
    for r, s in (ours.position >= 0).nonzero().tolist():
        for (keys, values), (k, v) in zip(ours.buffers, theirs.buffers, strict=True):
            torch.testing.assert_close(keys[r, :, s], k[r, :, s])
            torch.testing.assert_close(values[r, :, s], v[r, :, s])
    compiled = {"graphs": 0}
    clock = ForwardClock(torch.device("cpu"), lambda: (compiled["graphs"], 0), lambda: "static")
    with caplog.at_level("INFO", CLOCK_LOG), clock.timed(prefill=True):
        compiled["graphs"] += 1  # the block compiled a graph
    assert clock.compile_seconds > 0 and clock.prefill_seconds == 0
    assert (
        "recompiled" not in caplog.text
        and "static: compiled or loaded 1 graph(s) in" in caplog.text
    )
    caplog.clear()
    # new shapes after the first graph: each compile said, the start not said again
    with caplog.at_level("INFO", CLOCK_LOG):
        for _ in range(2):
            with clock.timed((1, 4), compiling=True):
                compiled["graphs"] += 1
    assert (
        "compiling its step" not in caplog.text
        and caplog.text.count("compiled or loaded 1 graph") == 2
    )
    fresh = ForwardClock(torch.device("cpu"), lambda: (compiled["graphs"], 0), lambda: "static")
    with caplog.at_level("INFO", CLOCK_LOG), fresh.timed((2, 1), compiling=True):
        assert "static: compiling its step for a new shape (rows, width (2, 1))" in caplog.text


def test_prefill_groups_by_length_or_padded_within_a_budget() -> None:
    lengths = [3, 0, 5, 3, 2, 5]
    assert prefill_groups(lengths, False, 4) == [[0, 3], [2, 5], [4]]
    assert prefill_groups(lengths, True, 100) == [[2, 5, 0, 3, 4]]
    # longest first, each forward at most `budget` padded tokens (rows x its longest)
    assert prefill_groups(lengths, True, 10) == [[2, 5], [0, 3, 4]]
    assert prefill_groups(lengths, True, 1) == [[2], [5], [0], [3], [4]]


def test_buckets_are_bounded_powers_of_two() -> None:
    assert [row_bucket(n) for n in (1, 2, 3, 5, 64, 65, 1000)] == [1, 2, 4, 8, 64, 128, 1024]
    assert [capacity_bucket(n) for n in (1, 64, 65, 128, 129, 300, 1025)] == [
        64,
        64,
        128,
        128,
        256,
        384,
        1152,
    ]


def test_attention_spans_follow_the_filled_slots_within_the_capacity() -> None:
    assert [attention_span(n, 1024) for n in (1, 64, 65, 129, 300, 1024)] == [
        64,
        64,
        128,
        256,
        384,
        1024,
    ]
    assert [attention_span(n, 1024, coarse=True) for n in (1, 65, 129, 300, 513)] == [
        64,
        128,
        256,
        512,
        1024,
    ]
    assert attention_span(300, 256) == attention_span(300, 256, coarse=True) == 256


def spans_seen(runners, monkeypatch) -> list[tuple[int, int, int, int, int]]:
    """Spy on the runners' static forwards: (slots filled after the block, span, mask width,
    width of the keys the attention got, capacity) for each forward, the list filled as
    they run."""
    seen: list[tuple[int, int, int, int, int]] = []
    attended: list[int] = []
    update = SlotMappedKV.update

    def spy_update(kv, *args, **kwargs):
        keys, values = update(kv, *args, **kwargs)
        attended.append(keys.shape[2])
        return keys, values

    monkeypatch.setattr(SlotMappedKV, "update", spy_update)
    for runner in runners:
        backend = getattr(runner.backend, "static", runner.backend)
        real = backend.step

        def step(ids, positions, mask, kv, real=real):
            attended.clear()
            filled = int(kv.layers[0].cumulative_length) + ids.shape[1]
            out = real(ids, positions, mask, kv)
            assert len(set(attended)) == 1, attended  # every layer attends over the span
            seen.append((filled, kv.span, mask.shape[1], attended[0], len(kv.columns)))
            return out

        backend.step = step
    return seen


@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
def test_a_forward_attends_over_its_filled_span_with_the_whole_capacitys_tokens(
    models, monkeypatch, captured, replayed
) -> None:
    """At a capacity of 1,024 slots, each static forward hands the attention the keys,
    values and mask of the span of the filled slots only (the write counter plus the block,
    bucketed: powers of two when captured), a span that grows with the tokens held, and
    the tokens are those of attending over the whole capacity and of the dynamic layout."""
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (90, 40, 60)]
    layout = {"static": True, "min_capacity": 1024, "captured": captured}
    dynamic = engine(models, GREEDY, None).generate(rows, SpeculativeDecoding(gamma=3), 40)
    cut = engine(models, GREEDY, None, **layout)
    seen = spans_seen(cut.present_runners.values(), monkeypatch)
    out = cut.generate(rows, SpeculativeDecoding(gamma=3), 40)
    assert [r.tokens for r in out] == [r.tokens for r in dynamic]
    assert len(seen) > 20 and {capacity for *_, capacity in seen} == {1024}
    for filled, span, mask_width, attended, capacity in seen:
        assert span == mask_width == attended == attention_span(filled, capacity, captured)
        assert filled <= span < capacity
    assert {span for _, span, *_ in seen} >= {128, 256}  # past 128 filled slots mid-way
    with monkeypatch.context() as whole:
        whole.setattr(static_cache, "attention_span", lambda filled, capacity, coarse: capacity)
        full = engine(models, GREEDY, None, **layout)
        seen_full = spans_seen(full.present_runners.values(), whole)
        out_full = full.generate(rows, SpeculativeDecoding(gamma=3), 40)
    assert {span for _, span, *_ in seen_full} == {1024}
    assert [r.tokens for r in out_full] == [r.tokens for r in out]


def test_the_switches_resolve_and_are_validated() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    conf = {"prefill_tokens": PREFILL_TOKENS}  # conf/config.yaml's: runner_layout requires it
    with pytest.raises(ValueError, match="decoding.prefill_tokens is not set"):
        runner_layout({}, cpu)
    # capture: resolved per runner (`resolve_layout`); the drafts as the target
    # (decoding.compile_drafts); a compiled layout carries its compile cache (default: auto)
    prefill = {"prefill_tokens": PREFILL_TOKENS, "captured": None, "drafts": {}}
    layout = ("static", "compiled", "min_capacity", "padded_prefill")
    auto = CompileCache(cache_folder("auto"))
    assert runner_layout(conf, cpu) == {
        **dict.fromkeys(layout, False),
        **prefill,
        "min_capacity": 0,
        "compile_cache": None,
    }
    assert runner_layout(conf, cuda) == {
        **dict.fromkeys(layout, True),
        **prefill,
        "min_capacity": 0,
        "compile_cache": auto,
    }
    assert runner_layout({**conf, "static_cache": True}, cpu) == {
        "static": True,
        "compiled": False,
        "min_capacity": 0,
        "padded_prefill": False,
        **prefill,
        "compile_cache": None,
    }
    on = runner_layout({"compile": "true", "prefill": "padded", "prefill_tokens": 9}, cpu)
    assert on == {
        "static": True,
        "compiled": True,
        "min_capacity": 0,
        "padded_prefill": True,
        "prefill_tokens": 9,
        "captured": None,
        "drafts": {},
        "compile_cache": auto,
    }
    assert runner_layout({**conf, "compile": True, "compile_cache": None}, cpu)[
        "compile_cache"
    ] == (
        CompileCache(None)  # null: the on-disk caches off
    )
    assert not runner_layout({**conf, "prefill": "by_length"}, cuda)["padded_prefill"]
    assert runner_layout({**conf, "static_capacity": 512}, cpu)["min_capacity"] == 512
    assert runner_layout({**conf, "capture": "false"}, cuda)["captured"] is False
    assert runner_layout({**conf, "capture": "true"}, cuda)["captured"] is True
    assert runner_layout({**conf, "capture": "true"}, cpu)["captured"] is False  # no CUDA graphs
    for bad in ("capture=always", "compile_drafts=never", "static_capacity=-1"):
        (line,) = config_problems(compose_config("stage=bench", f"decoding.{bad}"))
        assert line.startswith(f"decoding.{bad.split('=')[0]}=")
    for bad in ("prefill=sorted", "prefill_tokens=0"):
        (line,) = config_problems(compose_config("stage=bench", f"decoding.{bad}"))
        assert line.startswith(f"decoding.{bad.split('=')[0]}=")
    assert decoding_problems({"compile": "auto", "static_cache": "auto"}) == []
    assert runner_layout({**conf, "capture": "yes"}, cuda)["captured"] is True  # yes means true
    assert len(decoding_problems({"compile": True, "static_cache": False})) == 1
    config = compose_config()
    assert config.decoding.compile == "auto" and config.decoding.static_cache == "auto"
    assert config.decoding.prefill == "auto" and config.decoding.capture == "auto"
    assert decoding_problems(dict(config.decoding)) == []


@pytest.mark.heavy  # compiles
def test_the_target_forward_is_one_graph_at_every_bucket(models) -> None:
    """Dynamo traces the static-shape body with no graph break at batch buckets 1, 2, 4 and
    block widths 1 .. gamma_max + 1 (gamma_max 4 here), also through prepacked linears."""
    target = copy.deepcopy(models["target"])
    assert pack_linears(target) > 0  # the bench's float32 target multiplies by packed copies
    runner = build_runner(target, VOCAB, {"static": True})
    step = runner.backend.body
    for rows in (1, 2, 4):
        cache = runner.new_cache(rows, 16)
        for width in range(1, 6):
            ids = torch.zeros((rows, width), dtype=torch.long)
            positions, mask = cache.block(torch.full((rows,), width), width)
            with torch.inference_mode():
                report = torch._dynamo.explain(step)(ids, positions, mask, cache.kv)
            assert report.graph_break_count == 0, (rows, width, report.break_reasons)
            assert report.graph_count == 1


def test_spans_up_to_the_capacity_share_one_graph_once_the_span_is_symbolic(models) -> None:
    """The buffers hold a slot past the capacity, so no span slice covers a whole buffer:
    dynamo would otherwise guard on the slice being contiguous (`span == capacity`) and
    compile a graph the shorter spans' one could serve, one the next process need not share.
    Traced through AOTAutograd, whose guards these are, without inductor, on a code object
    of this test's own."""
    runner = build_runner(models["target"], VOCAB, {"static": True})
    cache = runner.new_cache(1, 64)
    counter = CompileCounterWithBackend("aot_eager")
    own = step_of_its_own(runner.backend.body.forward, "spans up to the capacity")
    step = torch.compile(own, backend=counter, fullgraph=True, dynamic=None)
    frames = []
    for span in (8, 16, 40, cache.capacity):
        cache.kv.span = span
        positions, mask = cache.block(torch.tensor([2]), 2)
        with torch.inference_mode():
            step(torch.zeros((1, 2), dtype=torch.long), positions, mask, cache.kv)
        frames.append(counter.frame_count)
    assert frames == [1, 2, 2, 2]  # the first span static, the second symbolic, then reused
    assert cache.kv.layers[0].keys.shape[2] == cache.capacity + 1


@pytest.mark.heavy  # compiles (aot_eager): past the quick set's budget
def test_a_compiled_step_is_two_graphs_whatever_its_rows_spans_capacities_and_widths(models):
    """What a run changes call to call is symbolic from the first call (`SYMBOLIC`,
    the width from the first prompt's), so prefills and then forwards of widths 1 and 4 at
    row buckets 2, 8 and 4, over growing spans and a capacity that grows, compile two graphs:
    width one, and past it."""
    runner = build_runner(models["target"], VOCAB, {"static": True})
    counter = CompileCounterWithBackend("aot_eager")
    own = step_of_its_own(runner.backend.body.forward, "two graphs")
    runner.backend.step = torch.compile(own, backend=counter, fullgraph=True, dynamic=None)
    # inputs made in inference mode, as a compiled runner's are (`StaticBackend.prepare`)
    with torch.compiler.config.patch(dynamic_sources=SYMBOLIC), torch.inference_mode():
        grew = []
        for rows, rounds in ((2, 12), (8, 2), (4, 2)):  # the first runs past its 64 slots
            cache = runner.new_cache(rows, 16)
            capacity = cache.capacity
            runner.prime(cache, [list(range(3, 14 + row % 3)) for row in range(rows)])
            for width in [1, 4] * rounds:
                ids = torch.full((rows, width), 5)
                counts = torch.full((rows,), width)
                runner.run(cache, ForwardRequest(ids, counts, torch.zeros(rows, 1, dtype=int)))
            grew.append(cache.capacity > capacity)
    assert grew[0] and counter.frame_count == 2


def compiled_trio(models) -> dict[str, ModelRunner]:
    """The target compiled (inductor), the draft in the static layout run eagerly."""
    return {
        "target": build_runner(models["target"], VOCAB, {"static": True, "compiled": True}),
        "draft": build_runner(models["draft"], VOCAB, {"static": True}),
    }


def assert_compiled_equals_eager(models, runners, rows, eos, policies, samplings) -> None:
    """The compiled runners emit what the same static layout run eagerly emits; compile time
    is kept out of the generation's wall time and out of the runner's forward seconds."""
    for sampling in samplings:
        compiled = build_engine(
            runners["target"],
            sampling,
            VOCAB,
            draft=runners["draft"],
            eos_token_id=eos,
            timings=fixed_timings(),
            pack_every=PACK_EVERY,
        )
        for policy in policies:
            eager = engine(models, sampling, eos, static=True).generate(rows, policy, NEW_TOKENS)
            out = compiled.generate(rows, policy, NEW_TOKENS)
            assert [r.tokens for r in out] == [r.tokens for r in eager], policy.name
    target = runners["target"]
    assert target.compiled and target.compile_seconds > 0
    assert target.seconds < target.compile_seconds  # the first calls of each shape left out


@pytest.mark.slow
@pytest.mark.smoke
def test_compiled_target_only_emits_the_eager_tokens(models) -> None:
    """One compiled shape (4 rows, width 1): the CI's compile budget (~30 s cold)."""
    runners = compiled_trio(models)
    assert_compiled_equals_eager(models, runners, PROMPTS, None, [TargetOnly()], [GREEDY, SAMPLING])


@pytest.mark.slow
def test_compiled_forwards_emit_the_eager_tokens(models) -> None:
    """target_only and sd, greedy and sampled: sd's rows overshoot their budgets at different
    rounds, so the batch runs at row buckets 4, 2, 1 and widths 1 .. 4."""
    policies = [TargetOnly(), SpeculativeDecoding(gamma=3)]
    runners = compiled_trio(models)
    assert_compiled_equals_eager(models, runners, PROMPTS, None, policies, [GREEDY, SAMPLING])


@pytest.mark.slow
def test_compiled_forwards_emit_the_eager_tokens_as_rows_leave(models, eos) -> None:
    """Rows stopping at EOS take the batch through the row buckets 8, 4, 2, 1."""
    policies = [TargetOnly(), SpeculativeDecoding(gamma=3), SVIP(0.25, 4, 0.15)]
    runners = compiled_trio(models)
    assert_compiled_equals_eager(models, runners, ROWS, eos, policies, [GREEDY, SAMPLING])


@pytest.mark.slow
def test_every_method_emits_the_eager_tokens_with_every_model_compiled(models, eos) -> None:
    """Target, draft and companion compiled (automatic dynamic shapes keep their graphs few),
    one policy of every registry class, greedy and sampled, rows leaving at EOS."""
    compiled = {
        role: build_runner(models[role], VOCAB, {"static": True, "compiled": True})
        for role in ("target", "draft", "companion")
    }
    for sampling in (GREEDY, SAMPLING):
        on_graphs = build_engine(
            compiled["target"],
            sampling,
            VOCAB,
            draft=compiled["draft"],
            companion=compiled["companion"],
            eos_token_id=eos,
            timings=fixed_timings(),
            pack_every=PACK_EVERY,
        )
        for fresh, again in zip(every_method(models), every_method(models), strict=True):
            eager = engine(models, sampling, eos, static=True).generate(ROWS, fresh, NEW_TOKENS)
            out = on_graphs.generate(ROWS, again, NEW_TOKENS)
            assert [r.tokens for r in out] == [r.tokens for r in eager], fresh.name
    assert all(r.compiled and r.compile_seconds > 0 for r in compiled.values())


@pytest.mark.law
@pytest.mark.slow
def test_sd_keeps_the_target_law_with_a_compiled_static_target(models) -> None:
    runner = build_runner(models["target"], VOCAB, {"static": True, "compiled": True})
    compiled = build_engine(
        runner,
        SAMPLING,
        VOCAB,
        draft=build_runner(models["draft"], VOCAB),
        timings=fixed_timings(),
        pack_every=PACK_EVERY,
    )
    counts = first_tokens(compiled, SpeculativeDecoding(gamma=2), ragged_rows(RUNS))
    assert_target_law_with_power(models, PROMPTS, counts, SAMPLING, VOCAB)


@pytest.mark.gpu
@pytest.mark.parametrize("captured", [True, False], ids=["captured", "reduce-overhead"])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLING], ids=["greedy", "sampled"])
def test_on_cuda_the_compiled_static_target_emits_the_dynamic_tokens(sampling, captured) -> None:
    """CUDA graphs over the static buffers, captured by hand (the GPU's default) or by
    `reduce-overhead` (`decoding.capture=false`), prompts prefilled padded, against the
    dynamic layout prefilled by length on the same GPU, float32; compile time stays out of
    the forward seconds."""
    cuda = {role: model.to("cuda") for role, model in tiny_trio().items()}
    runner = build_runner(
        cuda["target"],
        VOCAB,
        {"static": True, "compiled": True, "captured": captured, "prefill_tokens": PREFILL_TOKENS},
    )
    for policy in (TargetOnly(), SpeculativeDecoding(gamma=3)):
        plain = build_engine(
            build_runner(cuda["target"], VOCAB, {"padded_prefill": False}),
            sampling,
            VOCAB,
            draft=build_runner(cuda["draft"], VOCAB, {"padded_prefill": False}),
            timings=fixed_timings(),
            pack_every=PACK_EVERY,
        )
        compiled = build_engine(
            runner,
            sampling,
            VOCAB,
            draft=build_runner(cuda["draft"], VOCAB, {"prefill_tokens": PREFILL_TOKENS}),
            timings=fixed_timings(),
            pack_every=PACK_EVERY,
        )
        expected = [r.tokens for r in plain.generate(PROMPTS, policy, NEW_TOKENS)]
        for _ in range(2):  # the second generation replays recorded graphs
            assert [r.tokens for r in compiled.generate(PROMPTS, policy, NEW_TOKENS)] == expected
    assert runner.compile_seconds > 0 and runner.padded_prefill


def test_a_recompile_of_a_known_shape_is_compile_time_not_a_forward(models, monkeypatch, caplog):
    """Dynamo may compile again a shape the runner has seen (a guard failed): that forward's
    time goes to compile_seconds, with a warning, and never into the forward timings."""
    runner = build_runner(models["target"], VOCAB, {"static": True, "compiled": True})
    runner.backend.step = runner.backend.body  # the accounting alone: no real compile here
    counter = {"n": 0}
    monkeypatch.setattr(backends, "compiled_graphs", lambda: counter["n"])
    cache = runner.new_cache(1, 32)
    runner.prime(cache, [PROMPTS[0]])
    one = (torch.tensor([[3]]), torch.tensor([1]), torch.tensor([[0]]))
    runner.run(cache, ForwardRequest(*one))  # the shape's first call: compile time by its key
    assert runner.compile_seconds > 0 and runner.forward_times() == []
    before = runner.compile_seconds
    runner.run(cache, ForwardRequest(*one))  # known shape, no compile: a forward
    assert len(runner.forward_times()) == 1 and runner.compile_seconds == before
    real = runner.backend.body

    def recompiling(*args, **kwargs):
        counter["n"] += 1
        return real(*args, **kwargs)

    runner.backend.step = recompiling
    with caplog.at_level("WARNING"):
        runner.run(cache, ForwardRequest(*one))
    assert runner.compile_seconds > before and runner.forward_times() == []
    assert runner.compiles == 1 and "recompiled a shape" in caplog.text


@pytest.mark.slow
def test_the_engine_reuses_the_latency_profiles_graphs(models) -> None:
    """The bench's latency profile builds its inputs in inference mode and the engine outside
    it; dynamo guards on dispatch keys, so before the runner normalised its inputs the engine
    recompiled every shape the profile had compiled (the time hidden in its forwards)."""
    target = build_runner(
        models["target"], VOCAB, {"static": True, "compiled": True, "min_capacity": 128}
    )
    measure_runner_times({"target": target}, {"target": [1]}, 1, 16, torch.device("cpu"), [1])
    graphs = runner_module.compiled_graphs()
    assert target.compiles >= 1 and target.compile_seconds > 0
    engine = build_engine(target, SAMPLING, VOCAB, timings=fixed_timings(), pack_every=PACK_EVERY)
    engine.generate([PROMPTS[0]], TargetOnly(), 8)
    assert runner_module.compiled_graphs() == graphs


def test_the_engine_replays_the_latency_profiles_captured_graphs(models, replayed) -> None:
    """The profile times the forwards a round runs, warped as the engine warps them: the
    engine then replays the profile's graphs on the pooled cache, capturing none again (on a
    GPU each capture is a synchronisation and tens of milliseconds of set-up)."""
    target = build_runner(
        models["target"], VOCAB, {"static": True, "captured": True, "min_capacity": 128}
    )
    widths = {"target": [1]}
    measure_runner_times({"target": target}, widths, 1, 16, torch.device("cpu"), [1], SAMPLING)
    captures = target.graphs.captures
    assert captures == 1
    build_engine(target, SAMPLING, VOCAB, timings=fixed_timings(), pack_every=PACK_EVERY).generate(
        [PROMPTS[0]], TargetOnly(), 8
    )
    assert target.graphs.captures == captures


@pytest.fixture
def replayed(monkeypatch):
    monkeypatch.setattr(graphs, "CudaGraph", graphs.HostGraph)
    graphs.HostGraph.replays = 0
    return graphs.HostGraph


@pytest.mark.heavy  # every method twice, over the CPU budget of the quick set
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLING], ids=["greedy", "sampled"])
def test_captured_forwards_emit_the_static_layouts_tokens_for_every_method(
    models, eos, sampling, replayed
) -> None:
    """Every model's body replayed from captured graphs (CUDA graph semantics played on the
    CPU), one policy of each registry class, rows leaving at EOS: the tokens of the same
    layout run step by step, so no consumer reads a replay's output after the next one."""
    captured = engine(models, sampling, eos, static=True, captured=True)
    for fresh, again in zip(every_method(models), every_method(models), strict=True):
        plain = engine(models, sampling, eos, static=True).generate(ROWS, fresh, NEW_TOKENS)
        out = captured.generate(ROWS, again, NEW_TOKENS)
        assert [r.tokens for r in out] == [r.tokens for r in plain], fresh.name
    runners = captured.present_runners.values()
    assert all(r.layout == "static:captured" and len(r.graphs) > 0 for r in runners)
    assert replayed.replays > 10 * sum(r.graphs.captures for r in runners)
    assert all(r.compile_seconds > 0 for r in runners)  # each capture: compile time


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLING], ids=["greedy", "sampled"])
@pytest.mark.parametrize("policy", [SpeculativeDecoding(gamma=3), HeuristicSD(gamma_init=2)])
def test_a_fixed_length_draft_round_replays_as_one_graph(
    models, eos, sampling, policy, replayed
) -> None:
    """A round whose length is fixed before its first draft (`draft_graph`) replays its
    drafts as one graph and the verify as another: at most two replays a round, against one
    a draft step, with the per-step static layout's tokens (rows leaving at EOS, the row
    bucket shrinking)."""
    plain = engine(models, sampling, eos, static=True).generate(ROWS, policy, NEW_TOKENS)
    captured = engine(models, sampling, eos, static=True, captured=True)
    captured.generate(ROWS, policy, NEW_TOKENS)  # every shape captured
    before = replayed.replays
    out = captured.generate(ROWS, policy, NEW_TOKENS)
    stats = out[0].stats
    assert [r.tokens for r in out] == [r.tokens for r in plain]
    assert stats.draft_calls > stats.rounds  # drafting steps ran, several a round
    assert replayed.replays - before <= 2 * stats.rounds
    assert stats.draft_calls == plain[0].stats.draft_calls


def test_a_new_cache_is_a_new_capture_and_a_pooled_one_replays(models, replayed) -> None:
    runner = build_runner(models["target"], VOCAB, {"static": True, "captured": True})
    engine_ = build_engine(runner, GREEDY, VOCAB, timings=fixed_timings(), pack_every=PACK_EVERY)
    first = engine_.generate(PROMPTS, TargetOnly(), 6)
    captures = runner.graphs.captures
    assert captures >= 1  # the prefill is uncaptured; each decode shape once
    again = engine_.generate(PROMPTS, TargetOnly(), 6)  # the pool's buffers: replays only
    assert [r.tokens for r in again] == [r.tokens for r in first]
    assert runner.graphs.captures == captures
    pooled = runner.new_cache(len(PROMPTS))  # the pool's buffers: their graph replays
    fresh = runner.new_cache(len(PROMPTS))  # a second live cache of the shape: new buffers
    assert fresh.kv is not pooled.kv
    ids = torch.zeros((len(PROMPTS), 1), dtype=torch.long)
    counts = torch.ones(len(PROMPTS), dtype=torch.long)
    for cache, more in ((pooled, 0), (fresh, 1)):
        runner.prime(cache, PROMPTS)
        keep = torch.zeros((len(PROMPTS), 1), dtype=torch.long)
        u = torch.zeros(len(PROMPTS), dtype=torch.float64)
        runner.run(
            cache, ForwardRequest(ids, counts, keep, warp=GREEDY, then=Draw(u))
        )  # the engine draws
        assert runner.graphs.captures == captures + more


def test_broken_logits_met_in_a_replay_stop_the_generation_where_uncaptured_does(
    models, replayed
) -> None:
    """The captured graphs fold the broken-logits watch into the runner's own device scalar
    (`BrokenWatch.in_graphs`): logits that break after every shape was captured stop the next
    generation with the message the uncaptured static layout gives."""
    messages = []
    for captured in (False, True):
        target = copy.deepcopy(models["target"])
        runner = build_runner(target, VOCAB, {"static": True, "captured": captured})
        engine_ = build_engine(
            runner, GREEDY, VOCAB, timings=fixed_timings(), pack_every=PACK_EVERY
        )
        engine_.generate(PROMPTS, TargetOnly(), 4)  # every decode shape captured
        with torch.no_grad():
            target.lm_head.weight.fill_(float("nan"))
        replays = replayed.replays
        with pytest.raises(FloatingPointError, match="target model's logits") as error:
            engine_.generate(PROMPTS, TargetOnly(), 4)
        assert (replayed.replays > replays) == captured  # met in a replay
        messages.append(str(error.value))
    assert messages[0] == messages[1]


def test_a_replayed_forwards_outputs_outlive_the_next_replay(models, replayed) -> None:
    """A replay writes into the graph's own output buffers: what a forward returned must not
    change when the next forward of that shape replays (the engine may hold it)."""
    runner = build_runner(models["target"], VOCAB, {"static": True, "captured": True})
    cache = runner.new_cache(2)
    runner.prime(cache, PROMPTS[:2])
    counts, keep = torch.ones(2, dtype=torch.long), torch.zeros((2, 1), dtype=torch.long)
    held = []
    draws = torch.rand((3, 2), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for token, u in zip((3, 4, 5), draws, strict=True):  # a capture, then two replays
        request = ForwardRequest(
            torch.full((2, 1), token), counts, keep, warp=SAMPLING, then=Draw(u)
        )
        out = runner.run(cache, request)
        outputs = (out.logits, out.hidden, out.final, out.probs, out.drawn)
        held.append((out, u, [t.clone() for t in outputs]))
    assert replayed.replays == 2
    for out, u, seen in held:
        now = (out.logits, out.hidden, out.final, out.probs, out.drawn)
        assert all(torch.equal(t, s) for t, s in zip(now, seen, strict=True))
        assert torch.equal(out.probs, warp_probs(out.logits, SAMPLING))  # warped in the graph
        assert torch.equal(out.drawn, inverse_cdf(out.probs[:, 0], u))  # and drawn in it
    assert len({tuple(out.drawn.tolist()) for out, _, _ in held}) > 1  # the draws differ


def test_the_targets_forwards_are_transient_and_run_once_a_round(models, replayed) -> None:
    """The engine reads a target forward's outputs before the target's next one, so a
    captured runner hands them back uncopied (the next replay writes into the same buffers,
    with the values an uncaptured forward gives), and a round that ran the target twice
    stops instead of reading overwritten outputs."""
    runners = [
        build_runner(models["target"], VOCAB, {"static": True, "captured": c}) for c in (1, 0)
    ]
    caches = [runner.new_cache(2) for runner in runners]
    for runner, cache in zip(runners, caches, strict=True):
        runner.prime(cache, PROMPTS[:2])
    counts, keep = torch.ones(2, dtype=torch.long), torch.zeros((2, 1), dtype=torch.long)
    outs = []
    for token in (3, 4, 5):  # a capture, then two replays
        ids = torch.full((2, 1), token)
        out, want = (
            r.run(c, ForwardRequest(ids, counts, keep, warp=SAMPLING, transient=True))
            for r, c in zip(runners, caches, strict=True)
        )
        torch.testing.assert_close(out.probs, warp_probs(want.logits, SAMPLING))
        outs.append(out)
    assert replayed.replays == 2
    assert outs[1].logits.data_ptr() == outs[2].logits.data_ptr()  # the graph's own buffer
    engine_ = build_engine(
        runners[0], SAMPLING, VOCAB, timings=fixed_timings(), pack_every=PACK_EVERY
    )
    batch = engine_.new_batch(PROMPTS[:2], 4, [0, 1])
    everyone = torch.ones(2, dtype=torch.bool)
    engine_.target_probs(batch, Round(), everyone)
    with pytest.raises(RuntimeError, match="ran the target twice"):
        engine_.target_probs(batch, Round(), everyone)


def test_a_step_that_cannot_be_captured_runs_uncaptured(models, caplog) -> None:
    class Refusing:
        def __init__(self, pool) -> None:
            pass

        def capture(self, run, state):
            raise RuntimeError("operation not permitted when stream is capturing")

    calls = []

    def step(*args, kv):
        calls.append(args[0].clone())
        return args[0].float(), args[1].float()

    steps = graphs.CapturedSteps(step, new_graph=Refusing)
    ids, positions, mask = torch.ones((2, 1)), torch.zeros((2, 1)), torch.ones((2, 4))
    kv = object()
    for value in (1.0, 2.0, 3.0):
        out, _ = steps(ids * value, positions, mask, kv=kv)
        assert torch.equal(out, ids * value)
    assert len(calls) == 3 and steps.captures == 0 and len(steps) == 0
    assert "runs uncaptured" in caplog.text


def test_captured_steps_copy_inputs_in_and_forget_the_least_recent_shape() -> None:
    class Recorded:
        def __init__(self, pool) -> None:
            self.run = None

        def capture(self, run, state):
            self.run = run
            self.outputs = tuple(t.clone() for t in run())
            return self.outputs

        def replay(self) -> None:
            for buffer, value in zip(self.outputs, self.run(), strict=True):
                buffer.copy_(value)

    steps = graphs.CapturedSteps(lambda i, p, m, kv: (i * 2, p + m.sum()), Recorded, keep=2)
    kv = object()
    for rows in (1, 2, 1, 4):  # rows 2 is the least recent when 4 arrives
        ids = torch.full((rows, 1), float(rows))
        out, total = steps(ids, torch.zeros((rows, 1)), torch.ones((rows, 3)), kv=kv)
        assert torch.equal(out, ids * 2) and torch.equal(total, torch.full((rows, 1), 3.0 * rows))
    assert steps.captures == 3 and len(steps) == 2
    steps(torch.ones((2, 1)), torch.zeros((2, 1)), torch.ones((2, 3)), kv=kv)
    assert steps.captures == 4  # forgotten, captured again


@pytest.mark.gpu
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLING], ids=["greedy", "sampled"])
def test_on_cuda_captured_compiled_models_emit_the_eager_static_tokens(sampling) -> None:
    """Target, draft and companion compiled and replayed from hand-captured CUDA graphs (the
    GPU's default), rows leaving at EOS, against the same static layout run eagerly on the
    same GPU, float32; a second generation replays the first one's graphs."""
    cuda = {role: model.to("cuda") for role, model in tiny_trio().items()}
    eos = engine(cuda, GREEDY, None).generate([PROMPTS[0]], TargetOnly(), NEW_TOKENS)
    eos = eos[0].tokens[NEW_TOKENS // 3]
    captured = engine(cuda, sampling, eos, static=True, compiled=True)
    runners = captured.present_runners.values()
    assert all(r.layout == "compiled:captured" for r in runners)
    for policy in (TargetOnly(), SpeculativeDecoding(gamma=3), SVIP(0.25, 4, 0.15)):
        eager = engine(cuda, sampling, eos, static=True).generate(ROWS, policy, NEW_TOKENS)
        for _ in range(2):
            out = captured.generate(ROWS, copy.deepcopy(policy), NEW_TOKENS)
            assert [r.tokens for r in out] == [r.tokens for r in eager], policy.name
    captures = {r: r.graphs.captures for r in runners}
    captured.generate(ROWS, SpeculativeDecoding(gamma=3), NEW_TOKENS)
    assert {r: r.graphs.captures for r in runners} == captures  # replays, no new capture
    drafting = (captured.target, captured.draft)  # no method here runs the companion
    assert all(r.compile_seconds > 0 and r.seconds > 0 for r in drafting)
