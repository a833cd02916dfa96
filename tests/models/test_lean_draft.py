"""The distilled draft's lean forward and its restricted-vocabulary draft step.

`LeanDraft` must compute what the Hugging Face forward computes (float32 logits and hidden
states within 1e-5 through ragged appends, rejections, packing and rows leaving the batch),
and the engine's draft step on the head's K tokens must draw the same tokens under the same
seeds as the full-vocabulary step, from exactly the draft's law, while speculative decoding
keeps the target's law.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.dynamic_module_utils import get_class_from_dynamic_module

from sprinter_train.bench.timing.step_floor import measure_step_floor
from sprinter_train.core.distributions import entropy
from sprinter_train.core.sampling import SamplingConfig, warp_probs
from sprinter_train.decoding.batch import Round
from sprinter_train.decoding.builder import build_engine, build_runner, compiled_over_lean
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import SVIP, AdaEDL, SpeculativeDecoding, TargetOnly
from sprinter_train.decoding.runner.runner import ModelRunner
from sprinter_train.models import weight_packing as lean_module
from sprinter_train.models.lean import LeanDraft, supports_lean
from sprinter_train.models.roles import load_role
from sprinter_train.models.static_kv import KVLayer, StaticKV
from sprinter_train.models.student import SprinterDraftConfig, SprinterDraftForCausalLM
from sprinter_train.models.tiny import TINY_DEFAULTS, build_tiny_model
from sprinter_train.models.weight_packing import packs
from tests.decoding_helpers import (
    DECODING,
    PACK_EVERY,
    MemoRunner,
    chi_square_pvalue,
    exact_joint,
    feed_rows,
)

VOCAB = 128
HEAD = 64
PROMPTS = [[5, 17, 9, 33], [40, 41, 42, 43, 44, 45, 46], [7, 8], [60, 61, 62]]
SAMPLING = SamplingConfig(temperature=0.9, top_k=4, top_p=0.95)
GREEDY = SamplingConfig(temperature=0)
SHIPPED = Path(__file__).resolve().parents[2] / "checkpoints" / "drafts" / "smollm2-draft"


def restricted_copy(target: torch.nn.Module, seed: int, noise: float = 0.01) -> torch.nn.Module:
    """A restricted-head draft that is a near-copy of `target` on HEAD of its tokens, listed
    in shuffled order (the lean head must sort them): the target's layers, and the target's
    head rows for those tokens, plus seeded noise."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randperm(VOCAB, generator=gen)[:HEAD]
    ids = ids[ids != 2][: HEAD - 1]  # the EOS id stays outside the head: q = 0 there
    draft = SprinterDraftForCausalLM(
        SprinterDraftConfig(head_vocab_size=len(ids), **TINY_DEFAULTS)
    ).eval()
    with torch.no_grad():
        draft.model.load_state_dict(target.model.state_dict())
        draft.lm_head.weight.copy_(target.lm_head.weight[ids])
        draft.lm_head.token_ids.copy_(ids)
        for param in draft.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * noise)
    return draft


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return build_tiny_model({}, seed=0).float()


@pytest.fixture(scope="module")
def draft(target) -> torch.nn.Module:
    return restricted_copy(target, seed=1).float()


def factorised() -> torch.nn.Module:
    """A random draft with a factorised embedding and an (ordered) restricted head."""
    return build_tiny_model(
        {"head_vocab_size": HEAD, "embed_rank": 8, "num_hidden_layers": 3}, seed=2
    ).float()


def feed(runner: ModelRunner, cache, rows: list[list[int]], restricted: bool = False):
    """Append rows[r] to row r; outputs at every fed offset."""
    return feed_rows(runner, cache, rows, restricted)


def test_only_the_distilled_draft_runs_lean(draft) -> None:
    assert supports_lean(draft) and build_runner(draft, VOCAB).lean is not None
    plain = build_tiny_model({}, seed=0)
    assert not supports_lean(plain) and build_runner(plain, VOCAB).lean is None
    with pytest.raises(ValueError, match="sprinter_draft"):
        LeanDraft(plain)


def test_a_compiled_runner_takes_the_static_layout_over_the_lean_one(target, draft) -> None:
    """The lean buffers grow step by step, so on a GPU a compiled runner of the distilled draft
    runs it in the static layout instead; on a CPU the eager lean step is the faster and it
    stays lean; asked for either layout explicitly, it takes that one. In the static layout,
    eagerly, the restricted draft's rows are the lean ones."""
    assert compiled_over_lean(torch.device("cuda")) and not compiled_over_lean(draft.device)
    on_cpu = build_runner(draft, VOCAB, {"static": True, "compiled": True})
    assert on_cpu.lean is not None and not on_cpu.compiled and on_cpu.layout == "lean"
    assert (
        build_runner(target, VOCAB, {"static": True, "compiled": True}).layout == "compiled:packed"
    )
    compiled = build_runner(draft, VOCAB, {"static": True, "compiled": True}, lean=False)
    assert compiled.lean is None and compiled.static and compiled.compiled
    asked = build_runner(draft, VOCAB, {"static": True, "compiled": True}, lean=True)
    assert asked.lean is not None and not asked.compiled
    static = build_engine(
        build_runner(target, VOCAB),
        SAMPLING,
        VOCAB,
        draft=build_runner(draft, VOCAB, {"static": True}, lean=False),
        pack_every=PACK_EVERY,
    )
    _, lean = engine_pair(target, draft, SAMPLING)
    rows, seeds = PROMPTS * 2, list(range(8))
    for policy in policies():
        ours = static.generate(rows, policy, 16, seeds)
        assert [r.tokens for r in ours] == [
            r.tokens for r in lean.generate(rows, policy, 16, seeds)
        ]


@pytest.mark.parametrize("allowed", [True, False])
def test_models_lean_draft_decides_whether_a_loaded_draft_runs_lean(allowed: bool) -> None:
    spec = {"draft": {"path": "tiny_random", "config": {"head_vocab_size": HEAD}}}
    loaded = load_role({**spec, "lean_draft": allowed}, "draft").model
    assert supports_lean(loaded)
    assert (build_runner(loaded, VOCAB).lean is not None) == allowed
    assert build_runner(loaded, VOCAB, lean=True).lean is not None  # an explicit choice wins


@pytest.mark.parametrize("hidden_layer", [-1, 0, 1, 2])
@pytest.mark.parametrize("kind", ["near_copy", "factorised"])
def test_lean_forwards_equal_the_hf_forwards_through_the_row_cache(
    draft, kind: str, hidden_layer: int
) -> None:
    """Prefill, ragged appends (rows feeding 0-3 tokens), rejected drafts, packing and rows
    leaving the batch: lean and Hugging Face runners agree on logits and hidden states."""
    model = draft if kind == "near_copy" else factorised()
    hf = build_runner(model, VOCAB, hidden_layer=hidden_layer, lean=False)
    lean = build_runner(model, VOCAB, hidden_layer=hidden_layer)
    seqs = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15]]
    caches = [hf.new_cache(3), lean.new_cache(3)]
    assert isinstance(caches[1].kv, StaticKV)
    for runner, cache in zip((hf, lean), caches, strict=True):
        runner.prime(cache, [s[:-1] for s in seqs])
    new = [s[-1:] for s in seqs]
    rng = torch.Generator().manual_seed(0)
    for step in range(10):
        ref, out = (feed(r, c, new) for r, c in zip((hf, lean), caches, strict=True))
        for r, tokens in enumerate(new):
            n = len(tokens)
            torch.testing.assert_close(out.logits[r, :n], ref.logits[r, :n], atol=1e-5, rtol=0)
            torch.testing.assert_close(out.hidden[r, :n], ref.hidden[r, :n], atol=1e-5, rtol=0)
        rows = len(new)
        new = [
            torch.randint(
                3, VOCAB, (int(torch.randint(0, 4, (1,), generator=rng)),), generator=rng
            ).tolist()
            for _ in range(rows)
        ]
        kept = (caches[0].lengths - torch.randint(0, 3, (rows,), generator=rng)).clamp(min=1)
        for cache in caches:
            cache.truncate(kept)
            if step == 3:
                cache.pack(int(cache.lengths.max()))
            if step == 6:
                cache.select(torch.tensor([2, 0]))
        if step == 6:
            new = [new[2], new[0]]
        assert caches[0].lengths.tolist() == caches[1].lengths.tolist()
        assert caches[0].position.tolist() == caches[1].position.tolist()


def test_a_long_row_grows_the_buffers_and_keeps_its_past(draft) -> None:
    hf, lean = build_runner(draft, VOCAB, lean=False), build_runner(draft, VOCAB)
    prompt = [(7 * i) % 120 + 3 for i in range(300)]  # past the first buffer's capacity
    outs = []
    for runner in (hf, lean):
        cache = runner.new_cache(1)
        outs.append(feed(runner, cache, [prompt[:200]]).logits)
        for token in prompt[200:]:
            outs.append(feed(runner, cache, [[token]]).logits)
    half = len(outs) // 2
    for ref, out in zip(outs[:half], outs[half:], strict=True):
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", [{}, {"lean": False, "static": True}], ids=["lean", "static"])
def test_restricted_logits_are_the_full_ones_on_the_head_in_ascending_order(draft, layout) -> None:
    """The lean and static layouts hand a restricted draft step the head's K logits, not a
    scatter over the vocabulary (the compiled GPU draft runs the static one)."""
    runner = build_runner(draft, VOCAB, {**layout})
    full = feed(runner, runner.new_cache(2), PROMPTS[:2])
    head = feed(runner, runner.new_cache(2), PROMPTS[:2], restricted=True)
    support = head.support
    assert support is not None and full.support is None
    assert torch.equal(support, draft.lm_head.token_ids.sort().values)
    assert head.logits.shape[-1] == len(support) < VOCAB
    torch.testing.assert_close(head.logits, full.logits[..., support], atol=1e-6, rtol=0)
    off = torch.ones(VOCAB, dtype=torch.bool)
    off[support] = False
    assert torch.isneginf(full.logits[..., off]).all()


def test_the_lean_forward_follows_weights_changed_in_place(draft) -> None:
    model = restricted_copy(build_tiny_model({}, seed=0), seed=3).float()
    hf, lean = build_runner(model, VOCAB, lean=False), build_runner(model, VOCAB)
    before = feed(lean, lean.new_cache(1), [PROMPTS[0]]).logits
    with torch.no_grad():  # an optimiser step on a stacked and an unstacked weight
        model.model.layers[0].self_attn.k_proj.weight.mul_(1.5)
        model.model.layers[1].mlp.down_proj.weight.mul_(0.5)
    after = feed(lean, lean.new_cache(1), [PROMPTS[0]]).logits
    assert not torch.allclose(before, after)
    torch.testing.assert_close(
        after, feed(hf, hf.new_cache(1), [PROMPTS[0]]).logits, atol=1e-5, rtol=0
    )


@pytest.mark.skipif(
    not packs(torch.zeros(1, dtype=torch.bfloat16)), reason="no native bf16 oneDNN on this CPU"
)
def test_packed_bf16_weights_give_the_unpacked_values_and_follow_in_place_changes(
    monkeypatch,
) -> None:
    """A bf16 draft on the CPU multiplies by prepacked copies of its matrices: the logits and
    hidden states are those of the plain F.linear path bit for bit, before and after in-place
    changes to the matrices that only packing copies (o, down, the up-projection, the head)."""
    model = factorised().bfloat16()

    def outputs(runner: ModelRunner) -> tuple[torch.Tensor, torch.Tensor]:
        out = feed(runner, runner.new_cache(3), [PROMPTS[0], PROMPTS[2], []], restricted=True)
        return out.logits, out.hidden

    def plain() -> tuple[torch.Tensor, torch.Tensor]:
        with monkeypatch.context() as patch:
            patch.setattr(lean_module, "packs", lambda weight: False)
            return outputs(build_runner(model, VOCAB))

    packed = build_runner(model, VOCAB)
    before = outputs(packed)
    lean = packed.lean
    assert lean is not None and lean._packed_head.is_mkldnn and lean._packed_up.is_mkldnn
    assert all(w.is_mkldnn for layer in lean._layers for w in (layer.qkv, layer.o, layer.down))
    for ours, ref in zip(before, plain(), strict=True):
        assert torch.equal(ours, ref)
    with torch.no_grad():
        model.model.layers[0].self_attn.o_proj.weight.mul_(1.5)
        model.model.layers[1].mlp.down_proj.weight.mul_(0.5)
        model.model.embed_tokens.up.weight.mul_(2.0)
        model.lm_head.weight.mul_(-1.0)
    after = outputs(packed)
    assert not torch.equal(after[0], before[0])
    for ours, ref in zip(after, plain(), strict=True):
        assert torch.equal(ours, ref)


def test_static_kv_layer_writes_views_and_selects_rows() -> None:
    layer = KVLayer()
    block = torch.arange(2 * 1 * 3 * 2, dtype=torch.float).reshape(2, 1, 3, 2)
    keys, values = layer.append(block, -block)
    assert layer.length == 3 and torch.equal(keys, block) and torch.equal(values, -block)
    layer.keys = block[:, :, :2].flip(2)  # what RowCache.pack does: keys, then values
    layer.values = -block[:, :, :2].flip(2)
    assert layer.length == 2 and torch.equal(layer.values, -block[:, :, :2].flip(2))
    layer.select(torch.tensor([1]))
    assert torch.equal(layer.keys, block[1:, :, :2].flip(2))
    kv = StaticKV()
    assert kv.get_seq_length() == 0
    kv.update(block, block, 1)
    assert len(kv.layers) == 2 and kv.get_seq_length(1) == 3


def engine_pair(target, draft, sampling: SamplingConfig) -> tuple[Engine, Engine]:
    """The same engine with the draft through Hugging Face (full vocabulary) and lean."""
    return tuple(
        build_engine(
            build_runner(target, VOCAB),
            sampling,
            VOCAB,
            draft=build_runner(draft, VOCAB, lean=lean),
            pack_every=PACK_EVERY,
        )
        for lean in (False, True)
    )


def policies() -> list:
    return [
        SpeculativeDecoding(gamma=3),
        SVIP(h=0.25, max_gamma=4, c=0.15),  # reads the raw entropy
        AdaEDL(gamma=0.3, lam=0.4, max_gamma=4, warped_entropy=True),  # reads H(q)
    ]


@pytest.mark.parametrize("policy", policies(), ids=lambda p: p.name)
def test_greedy_rows_equal_the_hf_draft_and_target_only(target, draft, policy) -> None:
    hf, lean = engine_pair(target, draft, GREEDY)
    reference = hf.generate(PROMPTS, TargetOnly(), 24)
    ours = lean.generate(PROMPTS, policy, 24)
    assert [r.tokens for r in ours] == [r.tokens for r in hf.generate(PROMPTS, policy, 24)]
    assert [r.tokens for r in ours] == [r.tokens for r in reference]
    assert 0 < ours[0].stats.accepted <= ours[0].stats.drafted


@pytest.mark.parametrize("policy", policies(), ids=lambda p: p.name)
def test_sampled_rows_equal_the_hf_draft_under_the_same_seeds(target, draft, policy) -> None:
    hf, lean = engine_pair(target, draft, SAMPLING)
    rows, seeds = PROMPTS * 4, list(range(100, 116))
    ours = lean.generate(rows, policy, 20, seeds)
    assert [r.tokens for r in ours] == [r.tokens for r in hf.generate(rows, policy, 20, seeds)]
    assert 0 < ours[0].stats.accepted < ours[0].stats.drafted


def test_a_restricted_step_spreads_q_and_logits_over_the_vocabulary(target, draft) -> None:
    hf, lean = engine_pair(target, draft, SAMPLING)
    steps = []
    for engine in (hf, lean):
        batch = engine.new_batch(PROMPTS, 8, range(4))
        rnd = Round()
        active = torch.ones(len(PROMPTS), dtype=torch.bool)
        for _ in range(3):
            rnd.steps.append(engine.draft_step(batch, rnd, active))
        rnd.counts = torch.full((len(PROMPTS),), 3)
        steps.append(rnd)
    full, head = steps
    assert head.steps[0].support is not None and full.steps[0].support is None
    assert head.steps[0].head_q.shape[-1] == len(head.steps[0].support)
    torch.testing.assert_close(head.q(), full.q(), atol=1e-6, rtol=0)
    torch.testing.assert_close(head.q(), torch.stack([s.q for s in head.steps], 1))
    assert torch.equal(head.tokens(), full.tokens())
    for ours, ref in zip(head.steps, full.steps, strict=True):
        assert ours.q.shape == ref.q.shape == (len(PROMPTS), VOCAB)
        torch.testing.assert_close(ours.logits, ref.logits, atol=1e-5, rtol=0)
        for warped in (False, True):
            torch.testing.assert_close(
                ours.entropy(warped), entropy(ref.q if warped else ref.logits.softmax(-1))
            )


@pytest.mark.law
def test_the_restricted_draw_follows_the_drafts_law(draft) -> None:
    """20k rows' first drafted token against the draft's exact warped q (Hugging Face's
    logits over the full vocabulary); the counts reject a law off by one head token."""
    sampling = SamplingConfig(temperature=1.3)
    engine = build_engine(
        build_runner(draft, VOCAB),
        sampling,
        VOCAB,
        draft=build_runner(draft, VOCAB),
        pack_every=PACK_EVERY,
    )
    prompt = PROMPTS[0]
    q = warp_probs(MemoRunner(draft, VOCAB)._row(tuple(prompt))[0], sampling)
    counts: Counter = Counter()
    for start in range(0, 20000, 2000):
        batch = engine.new_batch([prompt] * 2000, 4, range(start, start + 2000))
        active = torch.ones(2000, dtype=torch.bool)
        step = engine.draft_step(batch, Round(), active)
        torch.testing.assert_close(step.q, q.expand(2000, -1), atol=1e-5, rtol=0)
        counts.update((int(x),) for x in step.tokens)
    expected = {(x,): float(q[x]) for x in q.nonzero().flatten().tolist()}
    assert chi_square_pvalue(counts, expected) > 1e-3
    support = draft.lm_head.token_ids.sort().values.tolist()
    shifted = {(support[(i + 1) % len(support)],): float(q[x]) for i, x in enumerate(support)}
    assert chi_square_pvalue(counts, shifted) < 1e-6


@pytest.mark.law
def test_sd_with_the_lean_restricted_draft_keeps_the_target_law(target, draft) -> None:
    """The first three tokens of 10k rows in ragged batches (the head misses half of the
    vocabulary, EOS included: those tokens only ever come from the target's corrections)."""
    engine = engine_pair(target, draft, SAMPLING)[1]
    counts: Counter = Counter()
    rows = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[2]] * 500
    for start in range(0, 20000, len(rows)):
        results = engine.generate(rows, SpeculativeDecoding(gamma=2), 3, range(start, start + 2000))
        counts.update(
            tuple(r.tokens) for r, p in zip(results, rows, strict=True) if p == PROMPTS[0]
        )
    expected = exact_joint(target, PROMPTS[0], 3, SAMPLING, VOCAB)
    assert chi_square_pvalue(counts, expected) > 1e-3
    law = exact_joint(draft, PROMPTS[0], 3, SAMPLING, VOCAB)  # the test has power
    halfway = {k: (expected.get(k, 0.0) + law.get(k, 0.0)) / 2 for k in {*expected, *law}}
    assert chi_square_pvalue(counts, halfway) < 1e-6


@pytest.mark.slow
@pytest.mark.smoke
@pytest.mark.skipif(
    not (SHIPPED / "model.safetensors").exists(), reason="the shipped draft's weights are absent"
)
@pytest.mark.parametrize("remote_code", [False, True])
def test_the_shipped_draft_loads_and_runs_lean(remote_code: bool) -> None:
    """Both ways of loading the shipped folder (this package's class, or the folder's own
    student.py) give a model the lean forward runs, with Hugging Face's logits."""
    if remote_code:  # what trust_remote_code loads where this package is not installed
        kind = get_class_from_dynamic_module("student.SprinterDraftForCausalLM", str(SHIPPED))
        assert kind.__module__ != SprinterDraftForCausalLM.__module__
    else:
        kind = AutoModelForCausalLM
    model = kind.from_pretrained(SHIPPED, dtype=torch.float32).eval()
    assert (type(model).__module__ == SprinterDraftForCausalLM.__module__) != remote_code
    hf, lean = build_runner(model, 49152, lean=False), build_runner(model, 49152)
    assert lean.lean is not None and lean.support is not None
    tokens = [[1, 4093, 314, 253, 1345, 30, 13, 2683, 198]]
    ref, out = (feed(r, r.new_cache(1), tokens) for r in (hf, lean))
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-4, rtol=0)
    ref, out = (feed(r, r.new_cache(1), tokens, restricted=True) for r in (hf, lean))
    torch.testing.assert_close(out.logits, ref.logits[..., lean.support], atol=1e-4, rtol=0)


def test_the_step_floor_times_the_lean_step_when_asked() -> None:
    draft = build_tiny_model({"head_vocab_size": 64, "embed_rank": 8}, seed=2)
    target = build_tiny_model({"num_hidden_layers": 3}, seed=1)
    sampling = SamplingConfig(0.2, 0, 0.9)
    report = measure_step_floor(
        draft, target, sampling, context=16, reps=2, lean=True, decoding=DECODING
    ).report()
    assert report["lean_step_ms"] > 0
    assert report["lean_over_floor"] == pytest.approx(report["lean_step_ms"] / report["floor_ms"])
    assert "lean_step_ms" not in (
        measure_step_floor(draft, target, sampling, 16, 2, decoding=DECODING).report()
    )
    plain = measure_step_floor(
        target, target, sampling, context=16, reps=2, lean=True, decoding=DECODING
    )
    assert plain.lean_ms is None


def test_a_cast_model_is_restacked_with_its_rotary_table() -> None:
    model = restricted_copy(build_tiny_model({}, seed=0), seed=4).float()
    lean = build_runner(model, VOCAB)
    feed(lean, lean.new_cache(1), [PROMPTS[1]])
    model.bfloat16()  # the same parameter objects, new storage
    hf = build_runner(model, VOCAB, lean=False)
    ours, ref = (feed(r, r.new_cache(1), [PROMPTS[1]]).logits for r in (lean, hf))
    assert lean.lean._rope_table.dtype == torch.bfloat16
    torch.testing.assert_close(ours, ref, atol=4e-3, rtol=0)  # a bf16 ulp (logits below 1)
