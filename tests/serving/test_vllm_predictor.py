"""The predictor vLLM's draft loop calls (serving/vllm/predictor.py), without vLLM: its score
of a drafted token is the project's CheckpointVerifier's on the offline draft's own outputs,
its rounds stop where sd_learned's rule stops for the same scores, and its row state follows
each request's rounds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from sprinter_train.core.sampling import SamplingConfig, warp_probs
from sprinter_train.decoding.batch import DraftStep, RowState
from sprinter_train.decoding.policies.plans.stop_rules import StopRule, Windows, drafts_of
from sprinter_train.models.student import SprinterDraftForCausalLM
from sprinter_train.serving.vllm.predictor import LengthPredictor, Requests, sampling_of
from sprinter_train.verifier.scorer import CheckpointVerifier
from tests.serving.vllm_helpers import DRAFT, export_folder

CONTEXTS = [[1, 4093, 314, 253, 1345], [1, 504, 6147, 282], [1, 49, 15345, 3252, 314, 253, 940]]


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_folder(tmp_path_factory.mktemp("export"))


@pytest.fixture(scope="module")
def draft() -> SprinterDraftForCausalLM:
    return SprinterDraftForCausalLM.from_pretrained(DRAFT, dtype=torch.float32).eval()


def bound(export: Path, draft: SprinterDraftForCausalLM) -> LengthPredictor:
    predictor = LengthPredictor(export)
    predictor.bind(
        draft.get_input_embeddings(), draft.head_token_ids(), int(draft.config.vocab_size)
    )
    return predictor


@torch.inference_mode()
def last_step(draft: SprinterDraftForCausalLM) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden (rows, d), head logits (rows, K)) of each context's last position."""
    hidden = torch.cat(
        [draft.model(input_ids=torch.tensor([c])).last_hidden_state[:, -1] for c in CONTEXTS]
    )
    return hidden, draft.head_logits(hidden).float()


@pytest.mark.parametrize("sampling", [SamplingConfig(0.0), SamplingConfig(0.2, 0, 0.9)])
def test_a_score_is_the_checkpoint_verifiers(export, draft, sampling) -> None:
    predictor = bound(export, draft)
    hidden, head_logits = last_step(draft)
    head_q = warp_probs(head_logits, sampling)
    support = draft.head_token_ids()
    head_tokens = head_q.multinomial(1, generator=torch.Generator().manual_seed(0))[:, 0]
    tokens = support[head_tokens]
    accepted, drafted = torch.tensor([0.0, 3.0, 7.0]), torch.tensor([0.0, 5.0, 9.0])
    index = 2  # the round's third draft: run_position 2 (a round starts on the target's token)
    state = RowState(torch.zeros(3, dtype=torch.long), accepted, drafted, None, None)  # type: ignore[arg-type]
    scores = predictor.score(tokens, hidden, head_logits, index, state, [sampling] * 3)

    verifier = CheckpointVerifier(predictor.checkpoint, draft)
    step = DraftStep(
        tokens,
        head_q,
        hidden,
        head_logits,
        torch.ones(3, dtype=torch.bool),
        support,
        int(draft.config.vocab_size),
        head_tokens=head_tokens,
    )  # the run carried by the row state here, by the step's index in the predictor
    rows = verifier.features(step, RowState(state.run + index, accepted, drafted, None, None))  # type: ignore[arg-type]
    expected = torch.sigmoid((rows @ verifier.weight + verifier.bias) / verifier.temperature)
    torch.testing.assert_close(scores.float(), expected, atol=2e-6, rtol=0)
    assert float(expected.max() - expected.min()) > 0.01  # the rows' scores differ


def test_rows_of_other_samplings_are_warped_each_their_own(export, draft) -> None:
    predictor = bound(export, draft)
    hidden, head_logits = last_step(draft)
    mixed = [SamplingConfig(0.0), SamplingConfig(0.7, 0, 0.9), SamplingConfig(1.0)]
    support = draft.head_token_ids()
    tokens = support[head_logits.argmax(-1)]
    state = RowState(torch.zeros(3, dtype=torch.long), torch.zeros(3), torch.zeros(3), None, None)  # type: ignore[arg-type]
    together = predictor.score(tokens, hidden, head_logits, 0, state, mixed)
    for i, sampling in enumerate(mixed):
        alone = predictor.score(
            tokens[i : i + 1],
            hidden[i : i + 1],
            head_logits[i : i + 1],
            0,
            RowState(
                *(t[i : i + 1] for t in (state.run, state.accepted, state.drafted)), None, None
            ),  # type: ignore[arg-type]
            [sampling],
        )
        torch.testing.assert_close(together[i : i + 1], alone)


def test_a_round_stops_each_row_where_sd_learneds_rule_does(export, draft, monkeypatch) -> None:
    predictor = bound(export, draft)
    rows, steps = 6, 8
    scores = torch.rand(
        (rows, steps), generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    scores[0] = 0.99  # drafts on to the last step
    scores[1, 0] = 0.01  # stops at its first draft
    monkeypatch.setattr(predictor, "score", lambda *args: scores[:, args[3]])
    rnd = predictor.start([f"r{i}" for i in range(rows)], [SamplingConfig(0.0)] * rows, "cpu")
    assert rnd is not None
    hidden, logits = torch.zeros(rows, 4), torch.zeros(rows, 8)
    for j in range(steps):
        going = rnd.step(torch.full((rows,), j), None, hidden, logits)
        if not going:
            break
    latency, step_cost = predictor.policy.costs(predictor.timings)
    taken = scores[:, : len(rnd.tokens)].numpy()
    windows = Windows(taken, taken, np.ones_like(taken, dtype=bool))
    expected = drafts_of(StopRule("goodput"), windows, rows, latency, step_cost)
    assert rnd.lengths.tolist() == expected.tolist()
    assert 1 in expected and steps in expected  # both ends of the rule are exercised
    assert rnd.drafts() == [list(range(n)) for n in expected]


def test_the_row_state_follows_each_requests_rounds() -> None:
    book = Requests()
    book.observe(["a", "b"], [0, 0], [0, 0])  # the prompts' prefill: nothing drafted
    book.observe(["a", "b"], [4, 2], [1, 2])
    book.observe(["b", "c"], [3, 0], [0, 0])  # a finished, c is new
    state = book.state(["b", "c"], torch.device("cpu"))
    assert state.drafted.tolist() == [5.0, 0.0] and state.accepted.tolist() == [2.0, 0.0]
    assert "a" not in book.drafted and state.run.tolist() == [0, 0]


def test_vllms_sampling_tensors_read_as_the_projects_configs() -> None:
    configs = sampling_of(torch.tensor([0.0, 0.2]), torch.tensor([1.0, 0.9]), None, 2)
    assert configs == [SamplingConfig(0.0, 0, 1.0), SamplingConfig(0.2, 0, 0.9)]
    assert sampling_of(None, None, torch.tensor([-1]), 1) == [SamplingConfig(0.0, 0, 1.0)]


def test_an_export_of_another_method_is_refused(export, tmp_path) -> None:
    manifest = json.loads((export / "export.json").read_text())
    manifest["method"] = "sprinter"
    other = tmp_path / "other"
    other.mkdir()
    for path in export.iterdir():
        if path.is_file():
            (other / path.name).write_bytes(path.read_bytes())
    (other / "export.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="export.method=sd_learned"):
        LengthPredictor(other)
