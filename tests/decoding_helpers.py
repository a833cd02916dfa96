"""Exact references and test doubles for the decoding tests.

`MemoRunner` gives full (cache-free) forwards of a real tiny model, memoised by prefix: the
exact laws the engine's batched, cached decoding is compared with. `FixedLogits` is a model
with hand-set next-token logits for the smallest exactness cases. `DECODING` is
conf/config.yaml's decoding section, the one place its values are written: the tests take
`PACK_EVERY` and `PREFILL_TOKENS` from it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from sprinter_train.core.config import conf_defaults
from sprinter_train.core.sampling import SamplingConfig, warp_probs
from sprinter_train.decoding.builder import build_engine, build_runner
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies.plans.companion_plan import CompanionPlan
from sprinter_train.decoding.runner.requests import ForwardRequest
from sprinter_train.decoding.runner.runner import ModelRunner
from sprinter_train.decoding.timings import StepCost, Timings
from sprinter_train.models.tiny import build_tiny_model

# conf/config.yaml's decoding section as written there, and the two values the engine and a
# padded prefill take from it (code keeps no default of either)
DECODING: dict[str, Any] = conf_defaults("config.yaml", "decoding")
PACK_EVERY = int(DECODING["pack_every"])
PREFILL_TOKENS = int(DECODING["prefill_tokens"])

# the tiny-model decoding tests' prompts, samplings and law-test sizes
VOCAB = 128
PROMPTS = [[5, 17, 9, 33], [40, 41, 42, 43, 44, 45, 46], [7, 8], [60, 61, 62]]
SAMPLING = SamplingConfig(temperature=0.9, top_k=4, top_p=0.95)
GREEDY = SamplingConfig(temperature=0)
RUNS = 20000  # rows of the first prompt; the other prompts ride along as batch-mates
BATCH = 1000


def latency(batch_size: int, tokens: int) -> float:
    """The tests' target forward: the same at every batch size (many rows are many B = 1)."""
    return 1.0 + 0.1 * tokens


def step_cost(batch_size: int) -> float:
    return 0.05


def fixed_timings(target=latency, step: StepCost = step_cost) -> Timings:
    """A cost model that learns nothing: `target` the target's forward, `step` a whole
    drafting step (priced as the draft's; the companion's is free)."""
    return Timings(target, draft=step, companion=lambda batch_size: 0.0, learn=False)


SV_PLAN = {"window": 256, "margin": 0.03, "warmup": 4, "probe_every": 16, "weight": 32.0}


def companion_plan(prior_alpha: float | None, **settings: Any) -> CompanionPlan:
    """sv's companion plan at conf/methods/sv.yaml's settings (SV_PLAN) but for `settings`."""
    return CompanionPlan(prior_alpha, **{**SV_PLAN, **settings})


def engine_for(
    models,
    sampling: SamplingConfig,
    timings: Timings | None = None,
    layout: dict[str, bool] | None = None,
    eos: int | None = None,
) -> Engine:
    """The trio's engine, pricing at `timings` (default: `fixed_timings()`), every runner in
    `layout` (`static`, `compiled`, `padded_prefill`; default: the runners' own) with conf's
    `prefill_tokens` and `pack_every`."""
    return build_engine(
        models["target"],
        sampling,
        VOCAB,
        draft=models["draft"],
        companion=models["companion"],
        layout={"prefill_tokens": PREFILL_TOKENS, **(layout or {})},
        eos_token_id=eos,
        pack_every=PACK_EVERY,
        timings=fixed_timings() if timings is None else timings,
    )


def ragged_rows(runs: int) -> list[list[int]]:
    """`runs` rows of PROMPTS[0], each followed by a row of another prompt in turn."""
    rows = []
    for i in range(runs):
        rows += [PROMPTS[0], PROMPTS[1 + i % 3]]
    return rows


def first_tokens(engine: Engine, policy, rows: list[list[int]], n: int = 3) -> list[Counter]:
    """Counts of the first n generated tokens per prompt of PROMPTS, row i seeded with i."""
    counts = [Counter() for _ in PROMPTS]
    for start in range(0, len(rows), BATCH):
        chunk = rows[start : start + BATCH]
        seeds = range(start, start + len(chunk))
        for prompt, result in zip(chunk, engine.generate(chunk, policy, n, seeds), strict=True):
            counts[PROMPTS.index(prompt)][tuple(result.tokens)] += 1
    return counts


class MemoRunner:
    """Memoised full (cache-free) forwards of `model`: the exact reference the decoding tests
    compare the engine's cached, batched forwards and laws with."""

    def __init__(self, model: torch.nn.Module, vocab_size: int) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self._memo: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    @torch.inference_mode()
    def _row(self, prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        if prefix not in self._memo:
            out = self.model(input_ids=torch.tensor([prefix]), output_hidden_states=True)
            for i in range(len(prefix)):
                self._memo[prefix[: i + 1]] = (
                    out.logits[0, i, : self.vocab_size].float(),
                    out.hidden_states[-1][0, i],
                )
        return self._memo[prefix]


def enumerate_joint(
    next_probs: Callable[[tuple[int, ...]], torch.Tensor], n: int
) -> dict[tuple[int, ...], float]:
    """P(first n generated tokens) when each follows `next_probs(generated so far)`."""
    out: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n):
        nxt: dict[tuple[int, ...], float] = {}
        for seq, prob in out.items():
            p = next_probs(seq)
            for x in p.nonzero().flatten().tolist():
                nxt[seq + (x,)] = prob * float(p[x])
        out = nxt
    return out


def exact_joint(
    model: torch.nn.Module, prompt: list[int], n: int, sampling: SamplingConfig, vocab: int
) -> dict[tuple[int, ...], float]:
    """P(first n generated tokens) under `model` with `sampling`, by enumeration."""
    runner = MemoRunner(model, vocab)
    return enumerate_joint(lambda seq: warp_probs(runner._row(tuple(prompt) + seq)[0], sampling), n)


def chi_square_pvalue(
    counts: dict[tuple[int, ...], int], expected: dict[tuple[int, ...], float]
) -> float:
    """Pearson's test; cells expected below 5 are pooled into one, as the test requires."""
    from scipy.stats import chisquare

    total = sum(counts.values())
    unexpected = set(counts) - set(expected)
    assert not unexpected, (
        f"outcomes with zero probability were generated: {sorted(unexpected)[:5]}"
    )
    big = [k for k, v in expected.items() if v * total >= 5]
    small = [k for k in expected if k not in big]
    observed = [counts.get(k, 0) for k in big]
    exp = [expected[k] * total for k in big]
    if small:
        observed.append(sum(counts.get(k, 0) for k in small))
        exp.append(sum(expected[k] for k in small) * total)
    exp_arr = np.array(exp)
    exp_arr *= sum(observed) / exp_arr.sum()
    return float(chisquare(observed, exp_arr).pvalue)


def assert_target_law_with_power(
    models: dict[str, torch.nn.Module],
    prompts: list[list[int]],
    counts: list[dict[tuple[int, ...], int]],
    sampling: SamplingConfig,
    vocab: int,
) -> None:
    """Each prompt's counted first three tokens follow the target's exact law, and the test has
    power: the first prompt's counts reject the mixture halfway to the draft's law."""
    for prompt, observed in zip(prompts, counts, strict=True):
        expected = exact_joint(models["target"], prompt, 3, sampling, vocab)
        assert chi_square_pvalue(observed, expected) > 1e-3, prompt
    expected = exact_joint(models["target"], prompts[0], 3, sampling, vocab)
    draft = exact_joint(models["draft"], prompts[0], 3, sampling, vocab)
    halfway = {k: (expected.get(k, 0.0) + draft.get(k, 0.0)) / 2 for k in {*expected, *draft}}
    assert chi_square_pvalue(counts[0], halfway) < 1e-6


def feed_rows(runner: ModelRunner, cache: Any, rows: list[list[int]], *restricted: bool) -> Any:
    """Append rows[r] to row r of `cache` in one forward; outputs at every fed offset."""
    width = max(1, max(map(len, rows)))
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    for r, new in enumerate(rows):
        ids[r, : len(new)] = torch.tensor(new, dtype=torch.long)
    counts = torch.tensor([len(new) for new in rows])
    keep = torch.arange(width).expand(len(rows), -1)
    return runner.run(cache, ForwardRequest(ids, counts, keep, *restricted))


class FixedLogits(torch.nn.Module):
    """A causal LM stand-in whose next-token logits are the same at every position: the
    hand-set distributions of the engine's smallest exactness cases."""

    def __init__(self, logits: list[float], hidden_size: int = 4) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(torch.tensor(logits), requires_grad=False)
        self.hidden_size = hidden_size

    @property
    def base_model(self) -> FixedLogits:
        return self

    def get_output_embeddings(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda hidden: self.logits.expand(*hidden.shape[:-1], -1)

    def forward(self, input_ids: torch.Tensor, past_key_values: Any = None, **_: Any) -> Any:
        from types import SimpleNamespace

        hidden = torch.zeros((*input_ids.shape, self.hidden_size))
        return SimpleNamespace(
            last_hidden_state=hidden, hidden_states=None, past_key_values=past_key_values
        )


def noisy_copy(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """A model that agrees with `model` often but not always (weights plus seeded noise)."""
    copy = build_tiny_model({}, seed=0)
    copy.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in copy.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * scale)
    return copy.eval()


def tiny_trio() -> dict[str, torch.nn.Module]:
    """A tiny target, a near-copy draft and a companion that disagrees with the draft (so A
    carries real information about x): the models of the engine's statistical tests."""
    target = build_tiny_model({}, seed=0)
    return {
        "target": target,
        "draft": noisy_copy(target, 0.01, 1),
        "companion": noisy_copy(target, 0.05, 2),
    }


def smallest_case_engine(sampling: SamplingConfig, timings: Timings | None = None) -> Engine:
    """p = q = (1/2, 1/2) and a companion c = (1, 0), on a two-token vocabulary: the case
    where the SV paper's rule emits token 0 with probability 3/4."""
    half, sure = FixedLogits([0.0, 0.0]), FixedLogits([0.0, float("-inf")])
    return build_engine(
        build_runner(half, 2),
        sampling,
        2,
        draft=build_runner(half, 2),
        companion=build_runner(sure, 2),
        pack_every=PACK_EVERY,
        timings=fixed_timings() if timings is None else timings,
    )


class ByA:
    """P(accept | S, A) = A: token 0 (A = 1) looks certain, token 1 (A = 0) hopeless."""

    prior = 0.5

    def lookup(self, S: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
        return A

    def lookup_s(self, S: torch.Tensor) -> torch.Tensor:
        return S


class ATable:
    """An SV table that leans hard on A: a rule that drops a drafted token on A's word would
    bias the law visibly."""

    prior = 0.5

    def lookup(self, S: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
        return 0.05 + 0.9 * A * S

    def lookup_s(self, S: torch.Tensor) -> torch.Tensor:
        return 0.05 + 0.45 * S
