"""From what transformers' `generate` prepared to one run of the engine, and back to its output.

`generate(custom_generate=<callable>)` validates the arguments, merges them into a
GenerationConfig (max_new_tokens -> max_length, EOS from the model's config, sampling) and
builds the stopping criteria; the exported methods take those and refuse what their exactness
or one-row run cannot honour: more than one sequence, padding, logits processors other than
temperature / top-k / top-p (they would change p and q unequally), beams, scores. Then the
engine (decoding/engine.py) decodes the one row with the method's policy, as the bench runs it,
and transformers' stopping criteria are asked after each committed token, so a stop string
ends the output where HF's own loop would.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.utils import ModelOutput

from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.decoding.batch import DecodeStats, Policy
from sprinter_train.decoding.builder import build_engine
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.timings import Timings

NEUTRAL: dict[str, tuple[Any, ...]] = {  # settings the engine cannot honour, at their no-op values
    "num_beams": (None, 1),
    "num_return_sequences": (None, 1),
    "min_length": (None, 0),
    "min_new_tokens": (None, 0),
    "repetition_penalty": (None, 1.0),
    "encoder_repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,),
    "force_words_ids": (None,),
    "sequence_bias": (None,),
    "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "min_p": (None,),
    "top_h": (None,),
    "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0),
    "exponential_decay_length_penalty": (None,),
    "guidance_scale": (None, 1.0),
    "watermarking_config": (None,),
    "penalty_alpha": (None,),
    "dola_layers": (None,),
    "token_healing": (None, False),
    "output_scores": (None, False),
    "output_logits": (None, False),
    "output_attentions": (None, False),
    "output_hidden_states": (None, False),
}
IGNORED_MODEL_KWARGS = {"position_ids", "use_cache", "logits_to_keep", "cache_position"}
# where generate hands over the KV cache it prepared: `cache` from transformers 5.24 on,
# `past_key_values` before; the engine keeps its own caches, so an empty one changes nothing
CACHE_KWARGS = ("cache", "past_key_values")
STATS = ("rounds", "drafted", "accepted", "verifier_accepted")  # what the output reports
STATS += ("target_calls", "draft_calls", "companion_calls")  # forwards, as the engine counts


@dataclass
class SpeculativeOutput(ModelOutput):
    """`return_dict_in_generate=True`: the sequences and the engine's counts of the run."""

    sequences: torch.LongTensor | None = None
    stats: dict[str, int] | None = None


def sampling_of(config: GenerationConfig) -> SamplingConfig:
    """Greedy unless do_sample; else the config's temperature, top-k and top-p."""
    if not config.do_sample:
        return SamplingConfig(temperature=0.0)
    return SamplingConfig(
        float(config.temperature if config.temperature is not None else 1.0),
        int(config.top_k or 0),
        float(config.top_p if config.top_p is not None else 1.0),
    )


def check_config(config: GenerationConfig) -> None:
    """Refuse, by name, every setting the engine would otherwise ignore."""
    bad = [
        f"{name}={getattr(config, name, None)!r}"
        for name, neutral in NEUTRAL.items()
        if getattr(config, name, None) not in neutral
    ]
    if bad:
        raise ValueError(
            f"the speculative methods sample with temperature, top_k and top_p only (p and q "
            f"warped alike keep speculative sampling exact); unsupported: {', '.join(bad)}"
        )


def eos_ids(config: GenerationConfig) -> set[int]:
    eos = config.eos_token_id
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])}


def check_inputs(input_ids: torch.Tensor, model_kwargs: dict[str, Any]) -> None:
    """One unpadded sequence, a fresh cache, nothing the engine would silently drop."""
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"the speculative methods decode one sequence at a time (batch size 1); got "
            f"{input_ids.shape[0]}: call generate once per prompt"
        )
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()):
        raise ValueError("padded inputs are not supported: pass the prompt without padding")
    for name in CACHE_KWARGS:
        cache = model_kwargs.get(name)
        if cache is not None and cache.get_seq_length() > 0:
            raise ValueError(f"a filled {name} is not supported: the methods keep their own caches")
    unknown = sorted(
        k
        for k, v in model_kwargs.items()
        if v is not None and k not in IGNORED_MODEL_KWARGS | {"attention_mask", *CACHE_KWARGS}
    )
    if unknown:
        raise ValueError(f"unsupported generate arguments for the speculative methods: {unknown}")


def warn_on_sampling(fitted: dict[str, Any] | None, sampling: SamplingConfig) -> None:
    """A predictor fitted under other sampling estimates the wrong acceptances: say so."""
    if fitted is None:
        return
    now = asdict(sampling)
    same = all(abs(float(fitted.get(k, now[k])) - float(now[k])) < 1e-9 for k in now)
    if not same:
        warnings.warn(
            f"the predictor was fitted on tokens sampled with {fitted}; this run samples with "
            f"{now}: its acceptance estimates may be off (the output law is unaffected for the "
            "lossless methods)",
            stacklevel=3,
        )


def run(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    config: GenerationConfig,
    stopping_criteria: Callable[..., Any] | None,
    model_kwargs: dict[str, Any],
    policy: Policy,
    draft: torch.nn.Module,
    decoding: Mapping[str, int],
    companion: torch.nn.Module | None = None,
    timings: Timings | None = None,
    hidden_layer: int = -1,
    fitted_sampling: dict[str, Any] | None = None,
) -> torch.Tensor | SpeculativeOutput:
    """Decode `input_ids` with `policy` on the engine and return what transformers' generate
    returns; `decoding`: the engine's `pack_every` and `prefill_tokens` (an export's, as its
    export.json recorded conf/config.yaml's). The row's random stream is seeded from torch's
    generator, so `torch.manual_seed` fixes a sampled output as it fixes HF's own."""
    check_inputs(input_ids, model_kwargs)
    check_config(config)
    sampling = sampling_of(config)
    warn_on_sampling(fitted_sampling, sampling)
    prompt = input_ids[0].tolist()
    if config.max_new_tokens is not None:
        budget = int(config.max_new_tokens)
    else:
        budget = int(config.max_length) - len(prompt)
    models = [m for m in (model, draft, companion) if m is not None]
    vocab = min(int(m.config.vocab_size) for m in models)  # ids past it are padding
    engine = build_engine(
        model,
        sampling,
        vocab,
        draft=draft,
        companion=companion,
        layout={"prefill_tokens": int(decoding["prefill_tokens"])},  # else the runners' own
        hidden_layer=hidden_layer,
        pack_every=int(decoding["pack_every"]),
        timings=timings,
    )
    eos = eos_ids(config)

    def stop(tokens: list[int]) -> bool:
        if tokens[-1] in eos:
            return True
        if stopping_criteria is None:
            return False
        ids = torch.tensor([tokens], device=input_ids.device)
        return bool(torch.as_tensor(stopping_criteria(ids, None)).all())

    seed = int(torch.randint(0, 2**62, ()))
    tokens, stats = decode(engine, policy, prompt, budget, seed, stop)
    sequences = torch.tensor([tokens], dtype=input_ids.dtype, device=input_ids.device)
    if config.return_dict_in_generate:
        return SpeculativeOutput(sequences=sequences, stats={k: getattr(stats, k) for k in STATS})
    return sequences


def decode(
    engine: Engine,
    policy: Policy,
    prompt: list[int],
    budget: int,
    seed: int,
    stop: Callable[[list[int]], bool],
) -> tuple[list[int], DecodeStats]:
    """One row through the engine's rounds (`Engine.generate`'s loop), its committed tokens cut
    after the first at which `stop(tokens so far)` holds; the prompt and what it generated,
    and the engine's counts."""
    batch = engine.new_batch([prompt], budget, [seed])
    row = batch.rows[0]
    while not row.finished:
        start = len(row.tokens)
        engine.commit(batch, policy.round(engine, batch), policy)
        for end in range(start + 1, len(row.tokens) + 1):
            if stop(row.tokens[:end]):
                del row.tokens[end:]
                row.finished = True
                break
    return row.tokens, batch.stats
