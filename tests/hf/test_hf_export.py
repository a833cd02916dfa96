"""stage=export and sprinter_train.hf: Hugging Face `generate` runs the exported methods as our
engine runs them.

Tiny Llamas in float32 saved as model folders (the draft a noisy copy of the target, so drafts
are often accepted), predictors written by the real writers (save_verifier, sv/fit.py's
binning, LatencyProfile.save), then `stage=export` for every method. Greedy output through
`generate(custom_generate=<folder>)` must equal the engine's (decoding/engine.py with the
policy of decoding/policies/) token for token, with the same rounds, drafts and acceptances,
so the rules are the same rules; the lossless ones must also equal target-only greedy, and
SPRINTER must not (else the comparison could not tell the rules apart).
"""

from __future__ import annotations

import ast
import base64
import inspect
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hydra.utils import get_class
from omegaconf import OmegaConf
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, StoppingCriteriaList

import sprinter_train.hf as hf
from sprinter_train.__main__ import run_stage
from sprinter_train.bench.run.methods import VerifierMismatchError
from sprinter_train.bench.timing.latency import LatencyProfile
from sprinter_train.core.config import compose_config
from sprinter_train.core.io import write_json
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.decoding.builder import build_engine
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.policies import (
    SVIP,
    LearnedLength,
    SpecVerification,
    Sprinter,
    TargetOnly,
)
from sprinter_train.decoding.policies.registry import with_trait
from sprinter_train.decoding.timings import Timings
from sprinter_train.harvest.manifest import model_identity
from sprinter_train.harvest.reader import MissingInputError
from sprinter_train.hf.bundle import Bundle
from sprinter_train.hf.folder import ENTRY
from sprinter_train.hf.identity import ModelMismatchError
from sprinter_train.hf.methods import SPECS
from sprinter_train.hf.prepare import CACHE_KWARGS, check_inputs
from sprinter_train.hf.vendor import VendorError, closure, flat_name
from sprinter_train.models.cache import returned_cache, with_cache
from sprinter_train.models.roles import load_role
from sprinter_train.models.tiny import build_tiny_model, build_tiny_tokenizer
from sprinter_train.sv.fit import fit_binning
from sprinter_train.sv.table import Binning, SVTable, sealed
from sprinter_train.verifier.checkpoint import load_verifier, save_verifier, verifier_path
from sprinter_train.verifier.labels import Label
from sprinter_train.verifier.scorer import CheckpointVerifier
from tests.decoding_helpers import (
    DECODING,
    PACK_EVERY,
    PREFILL_TOKENS,
    chi_square_pvalue,
    exact_joint,
    noisy_copy,
)

VOCAB, EOS, D = 128, 2, 64
PROMPTS = [[5, 17, 9, 33], [40, 41, 42, 43, 44, 45, 46]]
NEW = 24
GREEDY = SamplingConfig(temperature=0)
ALL_FEATURES = ["hidden", "token_embedding", "q", "draft_entropy"]
EXPECTED_FILES = {
    "sprinter": {"verifier-lam1.2.safetensors", "verifier-lam1.2.json"},
    "sd_learned": {"verifier-accept.safetensors", "verifier-accept.json"}
    | {"sv_table.json", "latency.json"},
    "svip": set(),
    "sv": {"sv_table.json", "latency.json"},
}


def write_verifier(
    path: Path,
    names: list[str],
    seed: int,
    draft: str | None,
    label: str = "ratio",
    base_rate: float = 0.35,
) -> Path:
    """A verifier with random weights, exported as stage=train exports one (a calibration
    temperature of 2 on the soft-label one; `base_rate` its train split's mean label)."""
    generator = torch.Generator().manual_seed(seed)
    width = sum({"hidden": D, "token_embedding": D, "q": 1, "draft_entropy": 1}[n] for n in names)
    weight = torch.randn(width, generator=generator) / 4
    meta: dict[str, Any] = {"features": {"names": names}, "hidden_layer": -1, "draft_model": draft}
    meta["class_balance"] = {"train": {"positive_fraction": 0.4, "mean_accept_prob": base_rate}}
    if label == "accept_prob":
        calibration = {"method": "temperature", "temperature": 2.0, "fitted_on": "val"}
        meta |= {"label": "accept_prob", "lam": None, "calibration": calibration}
    else:
        meta |= {"label": "ratio", "lam": 1.2}
    return save_verifier(path, weight, torch.tensor([0.3]), meta)


def write_table(path: Path, cfg=None) -> Path:
    """An SV table fitted by sv/fit.py on planted (S, A, X): X rises with A and S, sealed as
    stage=tables seals it, for the draft and companion of `cfg.models` (as export loads them)."""
    rng = np.random.default_rng(0)
    S, A = rng.random(4000), rng.random(4000)
    x = np.clip(0.05 + 0.9 * A * S + 0.05 * rng.standard_normal(4000), 0, 1)
    fitted = fit_binning(Binning.equal_width(4), S, A, x, min_count=5)
    models = {}
    if cfg is not None:
        specs = OmegaConf.to_container(cfg.models, resolve=True)
        roles = ("draft", "companion")
        models = {r: model_identity(load_role(specs, r, pack_linear=False)) for r in roles}
    payload = {"default": "4x4", "binnings": {"4x4": fitted}, "rows": 4000, "models": models}
    return write_json(path, sealed(payload))


def write_latency(path: Path) -> Path:
    target = {n: 10.0 + 0.2 * n for n in range(1, 10)}
    LatencyProfile(target, 0.5, 0.25, 128, "cpu", "float32").save(path)
    return path


def save_model(model: torch.nn.Module, folder: Path) -> str:
    model.save_pretrained(folder)
    build_tiny_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Models on disk, the experiment's predictors, and an export of every method."""
    root = tmp_path_factory.mktemp("hf")
    target = build_tiny_model({}, seed=0)
    models = {
        "target": target,
        "draft": noisy_copy(target, 0.01, 1),
        "companion": noisy_copy(target, 0.02, 2),
    }
    paths = {role: save_model(m, root / role) for role, m in models.items()}
    overrides = [
        "models=tiny_random",
        *(f"models.{role}.path={path}" for role, path in paths.items()),
        f"artifacts_root={root / 'artifacts'}",
        f"checkpoints_root={root / 'checkpoints'}",
        "experiment=toy",
        "device=cpu",
        "dtype=float32",
    ]
    cfg = compose_config("stage=export", *overrides)
    ck, exp = Path(cfg.checkpoint_dir), Path(cfg.experiment_dir)
    write_verifier(verifier_path(ck, 1.2), ["hidden"], 0, paths["draft"])
    accept = verifier_path(ck, Label("accept_prob"))
    write_verifier(accept, ["hidden"], 1, paths["draft"], "accept_prob")
    write_table(exp / "tables" / "sv_table.json", cfg)
    write_latency(exp / "bench" / "latency.json")
    with_table = {"sd_learned": ["methods.sd_learned.table={binning: null, optional: true}"]}
    results = {
        m: run_stage(
            compose_config("stage=export", f"export.method={m}", *overrides, *with_table.get(m, []))
        )
        for m in hf.METHODS
    }
    return {
        "cfg": cfg,
        "models": models,
        "paths": paths,
        "results": results,
        "root": root,
        "overrides": overrides,
    }


def folder(setup: dict[str, Any], method: str) -> Path:
    return Path(setup["results"][method]["export_dir"])


def engine_policy(setup: dict[str, Any], method: str):
    """The policy the bench would run, built from the files the export copied."""
    cfg, models = setup["cfg"], setup["models"]
    settings = json.loads((folder(setup, method) / "export.json").read_text())["settings"]
    table = SVTable.load(Path(cfg.experiment_dir) / "tables" / "sv_table.json").on("cpu")
    if method == "sprinter":
        checkpoint = load_verifier(verifier_path(cfg.checkpoint_dir, 1.2))
        return Sprinter(CheckpointVerifier(checkpoint, models["draft"]), **settings)
    if method == "svip":
        return SVIP(**settings)
    if method == "sv":
        return SpecVerification(table, **settings)
    checkpoint = load_verifier(verifier_path(cfg.checkpoint_dir, Label("accept_prob")))
    verifier = CheckpointVerifier(checkpoint, models["draft"])
    return LearnedLength(verifier, table, **settings)


def engine(models: dict[str, torch.nn.Module], profile: LatencyProfile | None = None) -> Engine:
    """The engine as the folder's callables build it (conf's decoding settings, which the
    export records), pricing at `profile` as the folder does (fixed: the run's forwards do
    not correct it)."""
    return build_engine(
        models["target"],
        GREEDY,
        VOCAB,
        draft=models["draft"],
        companion=models["companion"],
        layout={"prefill_tokens": PREFILL_TOKENS},
        eos_token_id=EOS,
        pack_every=PACK_EVERY,
        timings=None if profile is None else Timings(**profile.priors(), learn=False),
    )


def bench_profile(setup: dict[str, Any]) -> LatencyProfile:
    return LatencyProfile.load(Path(setup["cfg"].experiment_dir) / "bench" / "latency.json")


def through_folder(setup: dict[str, Any], method: str, prompt: list[int], **kwargs: Any):
    models = setup["models"]
    companion = {"companion_model": models["companion"]} if method in ("sv", "sd_learned") else {}
    return models["target"].generate(
        input_ids=torch.tensor([prompt]),
        custom_generate=str(folder(setup, method)),
        trust_remote_code=True,
        assistant_model=models["draft"],
        **companion,
        **kwargs,
    )


STATS = ("rounds", "drafted", "accepted", "verifier_accepted")
STATS += ("target_calls", "draft_calls", "companion_calls")  # forwards, as the engine counts


@pytest.mark.parametrize("method", list(hf.METHODS))
def test_the_export_stage_writes_every_file(setup, method: str) -> None:
    out = folder(setup, method)
    written = set(setup["results"][method]["files"])
    code = {f"custom_generate/{module.name}" for module in closure([ENTRY]).values()}
    code |= {
        f"custom_generate/{n}" for n in ("generate.py", "exported_files.py", "requirements.txt")
    }
    assert written == {"export.json", "README.md", *EXPECTED_FILES[method], *code}
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["method"] == method
    assert manifest["models"]["draft"]["name"] == setup["paths"]["draft"]
    decoding = setup["cfg"].decoding  # the settings the engine takes, as the export ran
    assert manifest["decoding"] == {k: decoding[k] for k in ("pack_every", "prefill_tokens")}
    assert Bundle.from_folder(out).arguments()["decoding"] == manifest["decoding"]
    for key, source in manifest["sources"].items():  # the experiment's files, byte for byte
        assert (out / manifest["files"][key]).read_bytes() == Path(source).read_bytes()
    embedded = ast.parse((out / "custom_generate" / "exported_files.py").read_text())
    files = ast.literal_eval(next(n for n in embedded.body if isinstance(n, ast.Assign)).value)
    assert set(files) == {"export.json", *EXPECTED_FILES[method]}
    for name, text in files.items():
        assert base64.b64decode(text) == (out / name).read_bytes()
    readme = (out / "README.md").read_text()
    assert 'custom_generate="<this folder>"' in readme and "assistant_model=draft" in readme


def test_sd_learned_by_default_exports_no_table_and_stays_lossless(setup, tmp_path) -> None:
    """conf/methods/sd_learned.yaml plans with the verifier alone: the folder holds no SV
    table, needs no companion, and its greedy output is the target's own."""
    out = tmp_path / "export-default"
    cfg = compose_config(
        "stage=export", "export.method=sd_learned", f"export.out_dir={out}", *setup["overrides"]
    )
    result = run_stage(cfg)
    assert "sv_table.json" not in result["files"] and "table" not in result["files"]
    assert not (out / "sv_table.json").exists()
    models = setup["models"]
    for prompt in PROMPTS:
        got = models["target"].generate(
            input_ids=torch.tensor([prompt]),
            custom_generate=str(out),
            trust_remote_code=True,
            assistant_model=models["draft"],
            max_new_tokens=NEW,
            do_sample=False,
        )
        reference = engine(models).generate([prompt], TargetOnly(), NEW)[0].tokens
        assert got[0, len(prompt) :].tolist() == reference


def test_the_stage_refuses_what_it_cannot_export(setup) -> None:
    """An unknown method, a verifier of another draft, missing inputs: each named, with the
    command that makes it, and no folder written."""
    overrides = [o for o in setup["overrides"] if not o.startswith("experiment=")]
    overrides.append("experiment=other")
    with pytest.raises(ValueError, match="choose one of sprinter"):
        run_stage(compose_config("stage=export", "export.method=mtad", *overrides))
    cfg = compose_config("stage=export", "export.method=sprinter", *overrides)
    write_verifier(verifier_path(cfg.checkpoint_dir, 1.2), ["hidden"], 0, "someone/else")
    with pytest.raises(VerifierMismatchError, match="draft_model 'someone/else'"):
        run_stage(cfg)
    learned = compose_config("stage=export", "export.method=sd_learned", *overrides)
    with pytest.raises(MissingInputError, match="stage=train experiment=other train.label"):
        run_stage(learned)
    write_verifier(verifier_path(cfg.checkpoint_dir, Label("accept_prob")), ["hidden"], 0, None)
    write_table(Path(cfg.experiment_dir) / "tables" / "sv_table.json", cfg)
    with pytest.raises(MissingInputError, match="stage=bench experiment=other"):
        run_stage(learned)
    assert not list(Path(cfg.checkpoint_dir).glob("export-*"))


@pytest.mark.parametrize("method", list(hf.METHODS))
def test_greedy_generate_through_the_folder_equals_the_engine(setup, method: str) -> None:
    models, policy = setup["models"], engine_policy(setup, method)
    for prompt in PROMPTS:
        ours = engine(models, bench_profile(setup)).generate([prompt], policy, NEW)[0]
        out = through_folder(
            setup, method, prompt, max_new_tokens=NEW, return_dict_in_generate=True
        )
        assert out.sequences[0, : len(prompt)].tolist() == prompt
        assert out.sequences[0, len(prompt) :].tolist() == ours.tokens
        assert {k: out.stats[k] for k in STATS} == {k: getattr(ours.stats, k) for k in STATS}
        target_only = engine(models).generate([prompt], TargetOnly(), NEW)[0].tokens
        if method == "sprinter":  # lossy: the verifier's word shows in the output
            assert ours.tokens != target_only and out.stats["verifier_accepted"] > 0
        else:
            assert ours.tokens == target_only
            assert 0 < out.stats["accepted"] <= out.stats["drafted"], out.stats


CALLABLE_CASES = [  # token features, the no-table rules, and a prior at which no draft pays
    ("sprinter", ALL_FEATURES, "ratio", 0.35),
    ("sd_learned", ALL_FEATURES, "accept_prob", 0.35),
    ("sd_learned", ["hidden"], "accept_prob", 0.35),
    ("sd_learned", ["hidden"], "accept_prob", 0.01),
]


@pytest.mark.parametrize(("method", "names", "label", "base_rate"), CALLABLE_CASES)
def test_the_callables_equal_the_engine(setup, tmp_path, method, names, label, base_rate) -> None:
    """custom_generate=<callable> (and the callable called directly) with the predictors as
    arguments, against the engine's policy with the same verifier."""
    models = setup["models"]
    path = tmp_path / "verifier-x.safetensors"
    write_verifier(path, names, 3, None, label, base_rate)
    scorer = CheckpointVerifier(load_verifier(path), models["draft"])
    latency = Path(setup["cfg"].experiment_dir) / "bench" / "latency.json"
    profile = LatencyProfile.load(latency)
    if method == "sprinter":
        policy: Any = Sprinter(scorer, tau=0.5, max_run=16)
        arguments: dict[str, Any] = {"verifier": path}
    else:
        policy = LearnedLength(scorer, None, max_gamma=8)  # no table: the draft's step alone
        arguments = {"verifier": path, "latency": latency}
    function = hf.METHODS[method]
    for prompt in PROMPTS:
        ours = engine(models, profile).generate([prompt], policy, NEW)[0]
        ids = torch.tensor([prompt])
        out = models["target"].generate(
            input_ids=ids,
            custom_generate=function,
            draft_model=models["draft"],
            max_new_tokens=NEW,
            return_dict_in_generate=True,
            **arguments,
        )
        assert out.sequences[0, len(prompt) :].tolist() == ours.tokens
        assert {k: out.stats[k] for k in STATS} == {k: getattr(ours.stats, k) for k in STATS}
        direct = function(
            models["target"],
            input_ids=ids,
            assistant_model=models["draft"],
            max_new_tokens=NEW,
            **arguments,
        )
        assert direct[0, len(prompt) :].tolist() == ours.tokens
    assert (ours.stats.drafted > 0) == (base_rate > 0.1)  # 0.01: no round is worth a draft


@pytest.mark.parametrize("method", list(hf.METHODS))
def test_sampling_respects_max_new_tokens_and_eos(setup, method: str) -> None:
    sampling = {"do_sample": True, "temperature": 0.9, "top_k": 8, "top_p": 0.95}
    prompt = PROMPTS[0]
    outputs = []
    for seed in range(3):
        torch.manual_seed(seed)
        out = through_folder(
            setup, method, prompt, max_new_tokens=12, eos_token_id=[127], **sampling
        )
        new = out[0, len(prompt) :].tolist()
        assert len(new) == 12 or (len(new) < 12 and new[-1] == 127)
        outputs.append(new)
    assert len({tuple(o) for o in outputs}) > 1  # it samples
    new = outputs[0]
    k = next(i for i in range(1, len(new)) if new[i] not in new[:i])  # a first occurrence
    torch.manual_seed(0)
    cut = through_folder(setup, method, prompt, max_new_tokens=12, eos_token_id=new[k], **sampling)
    assert cut[0, len(prompt) :].tolist() == new[: k + 1]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["svip", "sv", "sd_learned"])  # each lossless, exported
def test_the_lossless_methods_keep_the_target_law(setup, method: str) -> None:
    """The first three tokens of 1,500 sampled runs of the loop generate calls, against the
    target's exact law (chi-square); the test has power: the counts reject the mixture halfway
    to the draft's law. The draft is farther from the target here, so that mixture is far."""
    models, sampling = setup["models"], SamplingConfig(0.9, 4, 0.95)
    draft = noisy_copy(models["target"], 0.02, 4)
    arguments = Bundle.from_folder(folder(setup, method)).arguments()
    if "table" in arguments:
        arguments["companion_model"] = models["companion"]
    config = GenerationConfig(do_sample=True, temperature=0.9, top_k=4, top_p=0.95)
    config.max_new_tokens, config.eos_token_id = 3, None
    config.return_dict_in_generate = True
    prepared = {"logits_processor": LogitsProcessorList(), "stopping_criteria": None}
    prepared["stopping_criteria"] = StoppingCriteriaList()
    prompt, counts, accepted = PROMPTS[0], Counter(), 0
    for _ in range(1500):  # the callable as transformers calls it, with the folder's predictors
        out = hf.METHODS[method](
            models["target"],
            torch.tensor([prompt]),
            generation_config=config,
            draft_model=draft,
            **prepared,
            **arguments,
        )
        counts[tuple(out.sequences[0, len(prompt) :].tolist())] += 1
        accepted += out.stats["accepted"]
    assert accepted > 200  # drafts took part (of about 4,500 tokens)
    expected = exact_joint(models["target"], prompt, 3, sampling, VOCAB)
    assert chi_square_pvalue(counts, expected) > 1e-3
    drafts = exact_joint(draft, prompt, 3, sampling, VOCAB)
    halfway = {k: (expected.get(k, 0.0) + drafts.get(k, 0.0)) / 2 for k in {*expected, *drafts}}
    assert chi_square_pvalue(counts, halfway) < 1e-6


def test_an_export_json_without_the_decoding_settings_names_the_stage_that_rewrites_it(
    setup, tmp_path
) -> None:
    """An export.json from before `decoding` was recorded: the engine's pack_every and
    prefill_tokens have no default in code, so reading its arguments names stage=export."""
    old = tmp_path / "export-svip"
    old.mkdir()
    manifest = json.loads((folder(setup, "svip") / "export.json").read_text())
    del manifest["decoding"]
    (old / "export.json").write_text(json.dumps(manifest))
    with pytest.raises(
        ValueError, match=r"no decoding.pack_every, decoding.prefill_tokens.*stage=export"
    ):
        Bundle.from_folder(old).arguments()


def test_the_callables_engine_takes_the_decoding_settings_given_else_conf(
    setup, monkeypatch
) -> None:
    """A call's engine packs and pads its prefill with `decoding=` (an export folder's, from
    its export.json); a call without it reads conf/config.yaml's decoding section; a partial
    one is refused by name."""
    from sprinter_train.hf import prepare

    built: list[dict[str, Any]] = []

    def spy(*args: Any, **kwargs: Any) -> Engine:
        built.append(kwargs)
        return build_engine(*args, **kwargs)

    monkeypatch.setattr(prepare, "build_engine", spy)
    models, ids = setup["models"], torch.tensor([PROMPTS[0]])
    call = {"input_ids": ids, "draft_model": models["draft"], "max_new_tokens": 4}
    hf.svip(models["target"], **call, decoding={"pack_every": 3, "prefill_tokens": 7})
    hf.svip(models["target"], **call)
    assert [(b["pack_every"], b["layout"]["prefill_tokens"]) for b in built] == [
        (3, 7),
        (DECODING["pack_every"], DECODING["prefill_tokens"]),
    ]
    with pytest.raises(ValueError, match="decoding= lacks decoding.prefill_tokens"):
        hf.svip(models["target"], **call, decoding={"pack_every": 3})


def test_a_folder_refuses_another_draft_or_companion(setup) -> None:
    models = setup["models"]
    other = noisy_copy(models["target"], 0.01, 7)  # same shapes, other weights
    with pytest.raises(ValueError, match="made for the draft .* sampled weights differ") as error:
        models["target"].generate(
            input_ids=torch.tensor([PROMPTS[0]]),
            custom_generate=str(folder(setup, "svip")),
            trust_remote_code=True,
            assistant_model=other,
            max_new_tokens=4,
        )
    assert type(error.value).__name__ == ModelMismatchError.__name__  # the folder's own class
    smaller = build_tiny_model({"hidden_size": 32, "head_dim": 8}, seed=0)
    with pytest.raises(ValueError, match="hidden_size 32"):
        models["target"].generate(
            input_ids=torch.tensor([PROMPTS[0]]),
            custom_generate=str(folder(setup, "sprinter")),
            trust_remote_code=True,
            assistant_model=smaller,
            max_new_tokens=4,
        )
    with pytest.raises(ValueError, match="made for the companion"):
        models["target"].generate(
            input_ids=torch.tensor([PROMPTS[0]]),
            custom_generate=str(folder(setup, "sv")),
            trust_remote_code=True,
            assistant_model=models["draft"],
            companion_model=other,
            max_new_tokens=4,
        )


def test_a_batch_and_unsupported_settings_are_refused(setup) -> None:
    batch = torch.tensor([PROMPTS[0], PROMPTS[0]])
    with pytest.raises(ValueError, match="batch size 1"):
        setup["models"]["target"].generate(
            input_ids=batch,
            custom_generate=str(folder(setup, "svip")),
            trust_remote_code=True,
            assistant_model=setup["models"]["draft"],
            max_new_tokens=4,
        )
    with pytest.raises(ValueError, match="repetition_penalty"):
        through_folder(setup, "svip", PROMPTS[0], max_new_tokens=4, repetition_penalty=1.3)
    with pytest.raises(ValueError, match="draft_model="):
        setup["models"]["target"].generate(
            input_ids=torch.tensor([PROMPTS[0]]), custom_generate=hf.svip, max_new_tokens=4
        )


def test_the_cache_generate_prepares_is_accepted_and_a_filled_one_refused(setup) -> None:
    """transformers hands a custom_generate the (empty) KV cache it prepared, as `cache` from
    5.24 on and `past_key_values` before: both are accepted empty, refused once filled."""
    target, prompt = setup["models"]["target"], PROMPTS[0]
    plain = through_folder(setup, "svip", prompt, max_new_tokens=6)
    given = through_folder(
        setup, "svip", prompt, max_new_tokens=6, **with_cache(target, DynamicCache())
    )
    assert given.tolist() == plain.tolist()
    filled = returned_cache(target(input_ids=torch.tensor([prompt]), use_cache=True))
    assert filled.get_seq_length() == len(prompt)
    for name in CACHE_KWARGS:
        check_inputs(torch.tensor([prompt]), {name: DynamicCache(), "use_cache": True})
        with pytest.raises(ValueError, match=f"a filled {name} is not supported"):
            check_inputs(torch.tensor([prompt]), {name: filled})
    with pytest.raises(ValueError, match=r"unsupported generate arguments.*\['pixel_values'\]"):
        check_inputs(torch.tensor([prompt]), {"pixel_values": torch.zeros(1)})


@pytest.mark.heavy
def test_the_folder_runs_without_sprinter_train(setup) -> None:
    """A fresh interpreter that cannot import sprinter_train (and has an empty module cache)
    loads the folder and generates what the folder generates here."""
    script = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "sprinter_train":
            raise ImportError("sprinter_train must not be imported")
sys.meta_path.insert(0, Block())
import torch
from transformers import AutoModelForCausalLM
target = AutoModelForCausalLM.from_pretrained({setup["paths"]["target"]!r})
draft = AutoModelForCausalLM.from_pretrained({setup["paths"]["draft"]!r})
out = target.generate(input_ids=torch.tensor([{PROMPTS[0]!r}]), custom_generate={str(folder(setup, "sprinter"))!r},
                      trust_remote_code=True, assistant_model=draft, max_new_tokens=8)
print(out[0].tolist())
print(sorted(m for m in sys.modules if m.startswith("sprinter_train")))
"""
    modules = setup["root"] / "hf_modules"  # a fresh module cache: nothing copied before
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=setup["root"],
        env={**os.environ, "HF_MODULES_CACHE": str(modules), "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    tokens, imported = done.stdout.strip().splitlines()[-2:]
    expected = through_folder(setup, "sprinter", PROMPTS[0], max_new_tokens=8)
    assert json.loads(tokens) == expected[0].tolist()
    assert imported == "[]"
    assert list(modules.rglob("exported_files.py"))  # loaded from the folder it copied


def absolute(module: str, is_package: bool, target: str) -> str:
    """The module a `from <target> import` of `module` names (relative targets resolved)."""
    if not target.startswith("."):
        return target
    level = len(target) - len(target.lstrip("."))
    parts = module.split(".") if is_package else module.split(".")[:-1]
    rest = target.lstrip(".")
    return ".".join(parts[: len(parts) - level + 1] + ([rest] if rest else []))


IMPORT = r"^(\s*from )(sprinter_train\.[\w.]+|\.+[\w.]*)( import .*)$"


@pytest.mark.parametrize("method", list(hf.METHODS))
def test_the_folder_holds_only_the_package_own_modules(setup, method: str) -> None:
    """Every module of custom_generate/ but the two the stage writes is a module of the
    package, equal to its source but for `sprinter_train` imports made relative to the flat
    folder; they are what the methods import, and hf's among them are the adapter alone."""
    code = folder(setup, method) / "custom_generate"
    names = {p.name for p in code.glob("*.py")} - {"generate.py", "exported_files.py"}
    modules = closure([ENTRY])
    assert names == {module.name for module in modules.values()}
    adapter = {m.rsplit(".", 1)[1] for m in modules if m.startswith("sprinter_train.hf.")}
    assert adapter == {"methods", "prepare", "bundle", "identity"}
    for module in modules.values():
        copied = (code / module.name).read_text().splitlines()
        source = module.source.read_text().splitlines()
        assert len(copied) == len(source), module.name
        for ours, theirs in zip(source, copied, strict=True):
            if ours == theirs:
                continue
            match = re.match(IMPORT, ours)
            assert match, (module.name, ours, theirs)
            target = absolute(module.module, module.source.name == "__init__.py", match[2])
            assert theirs == match[1] + "." + flat_name(target) + match[3]
    assert {p.name for p in Path(hf.__file__).parent.glob("*.py")} == {
        "__init__.py",
        "methods.py",
        "prepare.py",
        "bundle.py",
        "identity.py",
        "folder.py",
        "vendor.py",
    }


def test_the_exported_policies_are_the_benchs(compose_cfg) -> None:
    """Each callable builds the policy class conf/methods/<name>.yaml names for the bench,
    and the methods with a callable are exactly those whose traits say they export."""
    cfg = compose_cfg("stage=export")
    for spec in SPECS:
        assert spec.policy is get_class(cfg.methods[spec.name]._target_), spec.name
    assert set(hf.METHODS) == set(with_trait(cfg.methods, exports=True))


def test_the_callables_defaults_are_conf_methods(compose_cfg) -> None:
    cfg = compose_cfg("stage=export")
    for name, function in hf.METHODS.items():
        params = inspect.signature(function).parameters
        for key, value in cfg.methods[name].items():
            if key in params and params[key].default is not None:
                assert params[key].default == value, (name, key)


def write_package(root: Path, modules: dict[str, str]) -> None:
    for name, text in modules.items():
        path = root / "sprinter_train" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_vendor_follows_imports_and_refuses_what_the_folder_cannot_run(
    tmp_path, monkeypatch
) -> None:
    """A module's top-level imports make the closure (relative ones too, package __init__s
    as files of their own); a function's imports are rewritten only into the closure (a
    relative one outside it made absolute); a heavy third-party import at import time,
    `import sprinter_train.x` and a module imported by name are refused, naming the chain
    that reached them."""
    from sprinter_train.hf import vendor

    monkeypatch.setattr(vendor, "ROOT", tmp_path / "sprinter_train")
    write_package(
        tmp_path,
        {
            "a/__init__.py": "",
            "a/entry.py": "from sprinter_train.a.pkg import x\nfrom .near import y\n\n\n"
            "def f():\n    import pandas\n    from sprinter_train.a.near import y\n"
            "    from sprinter_train.b.far import z\n    from ..b.far import z\n",
            "a/pkg/__init__.py": "from sprinter_train.a.pkg.inner import x\n",
            "a/pkg/inner.py": "import torch\n\nx = 1\n",
            "a/near.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
            "    from sprinter_train.b.far import z\ny = 2\n",
            "b/far.py": "import pandas\n\nz = 3\n",
            "b/bad.py": "import sprinter_train.a.near\n",
            "b/named.py": "from sprinter_train.a import near\n",
            "b/heavy.py": "from sprinter_train.b.far import z\n",
        },
    )
    found = vendor.closure(["sprinter_train.a.entry"])
    assert set(found) == {
        "sprinter_train.a.entry",
        "sprinter_train.a.near",
        "sprinter_train.a.pkg",
        "sprinter_train.a.pkg.inner",
    }
    entry = found["sprinter_train.a.entry"].text
    assert entry.startswith("from .a__pkg import x\nfrom .a__near import y\n")
    assert entry.endswith(
        "    from .a__near import y\n    from sprinter_train.b.far import z\n"
        "    from sprinter_train.b.far import z\n"
    )
    assert found["sprinter_train.a.pkg"].name == "a__pkg.py"
    assert "from .a__pkg__inner import x" in found["sprinter_train.a.pkg"].text
    assert "    from sprinter_train.b.far import z" in found["sprinter_train.a.near"].text
    with pytest.raises(
        VendorError, match=r"imports pandas .* sprinter_train.b.heavy -> sprinter_train.b.far"
    ):
        vendor.closure(["sprinter_train.b.heavy"])
    with pytest.raises(VendorError, match="as a module"):
        vendor.closure(["sprinter_train.b.bad"])
    with pytest.raises(VendorError, match="a module by name"):
        vendor.closure(["sprinter_train.b.named"])


def test_the_package_own_heavy_modules_are_refused() -> None:
    with pytest.raises(VendorError, match="harvest/reader.py:[0-9]+ imports pandas"):
        closure(["sprinter_train.harvest.reader"])
