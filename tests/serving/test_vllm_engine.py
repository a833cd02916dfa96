"""The draft and sd_learned's predictor inside vLLM (make test-vllm; skipped without vLLM).

On 16 ShareGPT test prompts x 64 tokens, the offline pair in float32, each vLLM method in its
own process as the bench runs it (serving/vllm/run.py):
- greedy, `vllm`, `vllm_sd` and `vllm_sd_learned` emit the project's target_only tokens;
- sampled at T 0.2, vLLM's acceptance with the exact draft is the project's sd's (same fixed
  number of drafts a round) within 0.03;
- the predictor's scores inside vLLM are the project's CheckpointVerifier's for the same
  drafted tokens (its standalone feature path, the draft run by Hugging Face), within 1e-4,
  and the row state vLLM's rounds read is the rounds' own counts;
- each round's draft lengths are what sd_learned's rule (stop_rules.drafts_of, the decoder's
  rule on records) gives for the same scores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from sprinter_train.bench.peers.hf_assisted import cut_after_eos
from sprinter_train.core.config import compose_config
from sprinter_train.core.sampling import SamplingConfig, warp_probs
from sprinter_train.data.prompts import load_prompts
from sprinter_train.decoding.batch import DraftStep, RowState
from sprinter_train.decoding.builder import build_engine
from sprinter_train.decoding.policies import LearnedLength, SpeculativeDecoding, TargetOnly
from sprinter_train.decoding.policies.plans.stop_rules import StopRule, Windows, drafts_of
from sprinter_train.decoding.timings import Timings
from sprinter_train.hf.bundle import Bundle
from sprinter_train.models.loading import local_folder
from sprinter_train.models.roles import load_roles
from sprinter_train.verifier.scorer import CheckpointVerifier
from tests.serving.vllm_helpers import export_folder

# heavy too: each test reads vLLM runs that cost minutes (the quick set's budget is 8 CPU s)
pytestmark = [pytest.mark.vllm, pytest.mark.heavy]
pytest.importorskip("vllm")

PROMPTS, NEW, BATCH = 16, 64, 4
SD_DRAFTS, LEARNED_DRAFTS = 4, 8
SAMPLED = {"temperature": 0.2, "top_p": 1.0, "top_k": 0}
GREEDY = {"temperature": 0.0}


def vllm_run(request: dict[str, Any], folder: Path, name: str) -> dict[str, Any]:
    """One method in its own process, as the bench runs it."""
    ask, out = folder / f"{name}.json", folder / f"{name}-result.json"
    ask.write_text(json.dumps(request))
    done = subprocess.run(
        [sys.executable, "-m", "sprinter_train.serving.vllm.run", str(ask), str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def setting(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("vllm")
    export = export_folder(root)
    cfg = compose_config(
        "stage=bench", "models=offline_default", "models.companion=null", "device=cpu"
    )
    roles = load_roles(cfg.models, torch.device("cpu"), torch.float32, companion=False)
    tokenizer = roles.target.tokenizer
    prompts = [p.input_ids for p in load_prompts(cfg.data, tokenizer, split="test")[:PROMPTS]]
    eos = int(tokenizer.eos_token_id)
    base = {
        "target": str(local_folder(cfg.models.target)),
        "dtype": "float32",
        "prompts": prompts,
        "max_new_tokens": NEW,
        "seed": 0,
        "batch_sizes": [BATCH],
        "runs": 1,
        "max_model_len": 2048,
        "stop_token_ids": [eos],
    }
    draft = {"draft": str(Path(cfg.models.draft.path).resolve())}
    learned = {**draft, "predictor": str(export), "trace": True}
    runs = {
        ("vllm", "greedy"): {**base, "sampling": GREEDY},
        ("vllm_sd", "greedy"): {**base, **draft, "sampling": GREEDY},
        ("vllm_sd_learned", "greedy"): {**base, **learned, "sampling": GREEDY},
        ("vllm_sd", "sampled"): {**base, **draft, "sampling": SAMPLED},
        ("vllm_sd_learned", "sampled"): {**base, **learned, "sampling": SAMPLED},
    }
    for (method, _), request in runs.items():
        request["num_speculative_tokens"] = (
            LEARNED_DRAFTS if method == "vllm_sd_learned" else SD_DRAFTS
        )
    results = {key: vllm_run(request, root, "-".join(key)) for key, request in runs.items()}
    return {
        "cfg": cfg,
        "roles": roles,
        "prompts": prompts,
        "eos": eos,
        "export": export,
        "results": results,
    }


def project_engine(setting: dict[str, Any], sampling: SamplingConfig):
    cfg, roles = setting["cfg"], setting["roles"]
    profile = Bundle.from_folder(setting["export"]).latency()
    return build_engine(
        roles.target.model,
        sampling,
        int(roles.target.model.config.vocab_size),
        draft=roles.draft.model,
        layout={"prefill_tokens": int(cfg.decoding.prefill_tokens)},
        eos_token_id=setting["eos"],
        pack_every=int(cfg.decoding.pack_every),
        timings=Timings(**profile.priors(), learn=False),
    )


def vllm_tokens(setting: dict[str, Any], method: str, mode: str) -> list[list[int]]:
    rows = setting["results"][(method, mode)]["batches"][str(BATCH)]["tokens"]
    return [cut_after_eos(row, {setting["eos"]}) for row in rows]


def test_greedy_vllm_methods_emit_the_projects_target_only_tokens(setting) -> None:
    engine = project_engine(setting, SamplingConfig(temperature=0))
    prompts = setting["prompts"]
    ours = []
    for start in range(0, len(prompts), BATCH):
        done = engine.generate(prompts[start : start + BATCH], TargetOnly(), NEW)
        ours += [cut_after_eos(r.tokens, {setting["eos"]}) for r in done]
    for method in ("vllm", "vllm_sd", "vllm_sd_learned"):
        theirs = vllm_tokens(setting, method, "greedy")
        differ = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
        assert not differ, f"{method}: prompts {differ} differ from target_only's tokens"


def test_vllms_acceptance_with_the_exact_draft_is_the_projects_sd(setting) -> None:
    sampling = SamplingConfig(temperature=SAMPLED["temperature"], top_p=SAMPLED["top_p"])
    engine = project_engine(setting, sampling)
    prompts, drafted, accepted = setting["prompts"], 0, 0
    for start in range(0, len(prompts), BATCH):
        done = engine.generate(
            prompts[start : start + BATCH], SpeculativeDecoding(gamma=SD_DRAFTS), NEW
        )
        drafted, accepted = drafted + done[0].stats.drafted, accepted + done[0].stats.accepted
    counters = setting["results"][("vllm_sd", "sampled")]["batches"][str(BATCH)]["spec_decode"]
    theirs = counters["num_accepted_tokens"] / counters["num_draft_tokens"]
    ours = accepted / drafted
    assert abs(theirs - ours) <= 0.03, (
        f"vLLM accepts {theirs:.3f} of drafts, the project {ours:.3f}"
    )


def traced(setting: dict[str, Any], mode: str) -> list[dict[str, Any]]:
    rounds = setting["results"][("vllm_sd_learned", mode)]["rounds"]
    assert rounds, "the predictor recorded no round"
    return rounds


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_the_predictors_scores_in_vllm_are_the_checkpoint_verifiers(setting, mode) -> None:
    roles, prompts = setting["roles"], setting["prompts"]
    draft = roles.draft.model
    checkpoint = Bundle.from_folder(setting["export"]).verifier()
    verifier = CheckpointVerifier(checkpoint, draft)
    config = SAMPLED if mode == "sampled" else GREEDY
    sampling = SamplingConfig(float(config["temperature"]), 0, float(config.get("top_p", 1.0)))
    outputs = vllm_tokens(setting, "vllm_sd_learned", mode)
    result = setting["results"][("vllm_sd_learned", mode)]["batches"][str(BATCH)]
    # a traced round names the engine's request id: the output's id and a suffix (rounds of
    # the untimed warm-up's requests have no output here)
    prompt_of = {rid: i for i, rid in enumerate(result["request_ids"])}
    order = {req: prompt_of.get(req.rsplit("-", 1)[0], prompt_of.get(req)) for req in
             {q for rnd in traced(setting, mode) for q in rnd["req_ids"]}}  # fmt: skip
    rounds = [r for r in traced(setting, mode) if any(order[q] is not None for q in r["req_ids"])]
    checked = 0
    for rnd in rounds[:40]:
        for row, req in enumerate(rnd["req_ids"]):
            i = order[req]
            if i is None or rnd["contexts"][row] > len(prompts[i]) + len(outputs[i]):
                continue  # a warm-up request, or drafts after the request's last token (its
                # last step's tokens past max_tokens are cut from the output, not the draft's)
            context = (prompts[i] + outputs[i])[: rnd["contexts"][row]]
            drafts = rnd["tokens"][row]
            ids = torch.tensor([context + drafts[:-1]])
            with torch.inference_mode():
                hidden = draft.model(input_ids=ids).last_hidden_state[0, len(context) - 1 :]
                head_logits = draft.head_logits(hidden).float()
            support = draft.head_token_ids()
            tokens = torch.tensor(drafts)
            state = RowState(
                torch.zeros(1, dtype=torch.long),
                torch.tensor([rnd["accepted"][row]]),
                torch.tensor([rnd["drafted"][row]]),
                None,  # type: ignore[arg-type]
                None,  # type: ignore[arg-type]
            )
            for k in range(len(drafts)):
                step = DraftStep(
                    tokens[k : k + 1],
                    warp_probs(head_logits[k : k + 1], sampling),
                    hidden[k : k + 1].float(),
                    head_logits[k : k + 1],
                    torch.ones(1, dtype=torch.bool),
                    support,
                    int(draft.config.vocab_size),
                    head_tokens=torch.searchsorted(support, tokens[k : k + 1]),
                    index=k,
                )
                rows = verifier.features(step, state)
                z = (rows @ verifier.weight + verifier.bias) / verifier.temperature
                expected = float(torch.sigmoid(z)[0])
                assert abs(rnd["scores"][row][k] - expected) <= 1e-4, (req, k)
                checked += 1
    assert checked > 100


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_the_row_state_is_the_rounds_own_counts(setting, mode) -> None:
    """A request's drafts proposed and kept, as its next round reads them, are its traced
    rounds' lengths and the tokens they committed (kept drafts + the target's one)."""
    last: dict[str, tuple[int, float, float, int]] = {}
    for rnd in traced(setting, mode):
        for row, req in enumerate(rnd["req_ids"]):
            now = (rnd["contexts"][row], rnd["accepted"][row], rnd["drafted"][row])
            if req in last:
                context, accepted, drafted, length = last[req]
                kept = now[0] - context - 1
                assert now[2] - drafted == length and now[1] - accepted == kept, req
            last[req] = (*now, rnd["lengths"][row])


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_vllms_draft_lengths_are_sd_learneds_for_the_same_scores(setting, mode) -> None:
    bundle = Bundle.from_folder(setting["export"])
    timings = Timings(**bundle.latency().priors(), learn=False)
    policy = LearnedLength(verifier=None, table=None, max_gamma=LEARNED_DRAFTS)  # type: ignore[arg-type]
    latency, step_cost = policy.costs(timings)
    for rnd in traced(setting, mode):
        scores = np.array(rnd["scores"], dtype=np.float64)
        windows = Windows(scores, scores, np.ones_like(scores, dtype=bool))
        expected = drafts_of(StopRule("goodput"), windows, rnd["rows"], latency, step_cost)
        assert expected.tolist() == rnd["lengths"], rnd
