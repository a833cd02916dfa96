"""The in-step score (verifier/fused.py) equals the standalone verifier's on the same rows: a
linear head block by block, the embedding block as a table, the temperature folded in, and
its `apply` (what a draft step's graph runs) drawing the token `Draw` draws and scoring it.
On the host it keeps the row state's part over a round: a round's steps, a commit and a
graph's buffers rewritten in place each score as the standalone path does."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from sprinter_train.core.distributions import top2_margin
from sprinter_train.core.sampling import SamplingConfig, inverse_cdf, warp_probs
from sprinter_train.decoding.batch import DraftStep, RowState
from sprinter_train.decoding.features.table import FEATURES, DecodeInputs, feature_order
from sprinter_train.models.loading import load_model
from sprinter_train.verifier.checkpoint import load_verifier
from sprinter_train.verifier.fused import ROW_ONLY
from sprinter_train.verifier.fused_host import HOST_SCALARS, HostStep
from sprinter_train.verifier.scorer import CheckpointVerifier
from tests.scorer_helpers import (
    DRAFT,
    SETTINGS,
    VOCAB,
    draft_step,
    export_verifier,
    new_batch,
    width,
    write_records,
)

ALL = list(feature_order())
DEFAULT = [
    "hidden",
    "token_embedding",
    "q",
    "draft_entropy",
    "draft_margin",
    "draft_entropy_raw",
    "run_position",
    "accept_so_far",
]


@pytest.fixture(scope="module")
def draft_model() -> torch.nn.Module:
    return load_model(DRAFT, "draft", torch.device("cpu"), torch.float32).model


def standalone(verifier: CheckpointVerifier, step: DraftStep, state) -> torch.Tensor:
    """sigmoid((w . s + b) / T) over the whole vector `assemble` builds, as training does."""
    rows = verifier.features(step, state)
    logits = rows @ verifier.weight + verifier.bias
    return torch.sigmoid(logits / verifier.temperature)


@pytest.mark.parametrize("host", [True, False], ids=["host", "device-path"])
@pytest.mark.parametrize("names", [["hidden"], ["token_embedding", "q"], DEFAULT, ALL])
def test_the_in_step_score_is_the_standalone_score(tmp_path, draft_model, names, host) -> None:
    """Both ways of the sum: the host's (a CPU step) and the one a GPU step records."""
    record = write_records(tmp_path / "toy")
    path = export_verifier(tmp_path / "ck", names, width(names), temperature=1.7)
    verifier = CheckpointVerifier(load_verifier(path), draft_model)
    assert verifier.fused is not None and verifier.fused.host
    verifier.fused.host = host
    rows = list(range(12))
    step, batch = draft_step(record, rows), new_batch(record, rows)
    fused = verifier(None, batch, None, step)
    torch.testing.assert_close(fused, standalone(verifier, step, batch.state), rtol=0, atol=2e-6)
    assert fused.std() > 1e-3  # rows scored apart, far beyond the tolerance: an error shows


def test_apply_draws_as_draw_does_and_scores_its_token(tmp_path, draft_model) -> None:
    """`apply(probs, logits, hidden, u, *state)`, the graph's work: the token inverse_cdf
    draws at u, and the score the standalone path gives that token."""
    record = write_records(tmp_path / "toy")
    path = export_verifier(tmp_path / "ck", DEFAULT, width(DEFAULT), temperature=0.8)
    verifier = CheckpointVerifier(load_verifier(path), draft_model)
    scorer = verifier.fused
    assert scorer is not None and scorer.row_fields == ("run", "accepted", "drafted")
    rows = list(range(10))
    step, batch = draft_step(record, rows), new_batch(record, rows)
    u = torch.rand(len(rows), generator=torch.Generator().manual_seed(0))
    scorer.bind(None, step.head_q.shape[-1])
    state = tuple(getattr(batch.state, f) for f in scorer.row_fields)
    drawn, score = scorer.apply(
        step.head_q[:, None], step.head_logits[:, None], step.hidden[:, None], u, *state
    )
    expected_token = inverse_cdf(step.head_q, u)
    assert torch.equal(drawn, expected_token)
    redrawn = draft_step(record, rows)
    redrawn.tokens = drawn
    torch.testing.assert_close(score, standalone(verifier, redrawn, batch.state), rtol=0, atol=2e-6)


HEAD = 64  # a restricted head's tokens, of the toy's VOCAB


def head_step(record, rows: list[int], support, index: int, seed: int) -> tuple[DraftStep, tuple]:
    """The k-th draft step of a round on a restricted head (K = HEAD ids `support`), as the
    engine hands it over: the step (its laws on the head, its tokens drawn there, `index` k)
    and the (probs, logits, hidden) of its forward, (rows, 1, ...)."""
    generator = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(len(rows), HEAD, generator=generator)
    logits[:, 5] = float("-inf")  # a token off the draft's reach: p = 0, 0 log 0
    q = warp_probs(logits, SamplingConfig(top_k=20))
    drawn = inverse_cdf(q, torch.rand(len(rows), generator=generator))
    hidden = record["hidden"][torch.tensor(rows)].float()
    active = torch.ones(len(rows), dtype=torch.bool)
    step = DraftStep(
        support[drawn], q, hidden, logits, active, support, VOCAB, head_tokens=drawn, index=index
    )
    return step, (q[:, None], logits[:, None], hidden[:, None])


@pytest.mark.parametrize("names", [DEFAULT, ALL])
def test_a_round_scores_as_the_standalone_path_step_by_step_and_after_a_commit(
    tmp_path, draft_model, names
) -> None:
    """A round's steps scored as the engine scores them on the host (`score_drawn`, the run
    counting the round's drafts so far; `__call__`, the step's index), the row state's part
    kept over the round: each step equals the standalone score. After a commit (new
    accepted / drafted tensors, as `RowState.after` makes them) and after an in-place write
    of a field, the scores follow the new state: nothing stale is reused."""
    record = write_records(tmp_path / "toy")
    path = export_verifier(tmp_path / "ck", names, width(names), temperature=1.3)
    verifier = CheckpointVerifier(load_verifier(path), draft_model)
    scorer = verifier.fused
    assert scorer is not None and scorer.host
    support = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1))[:HEAD].sort()[0]
    scorer.bind(support, VOCAB)
    rows = list(range(3, 13))
    state = new_batch(record, rows).state

    def round_scores(state: RowState, seed: int) -> list[torch.Tensor]:
        scores = []
        for k in range(4):
            step, forward = head_step(
                record, [(r + 7 * k) % 40 for r in rows], support, k, seed + k
            )
            read = state.read(scorer.row_fields, SimpleNamespace(calls={"draft": k}))
            drawn = scorer.score_drawn(*forward, step.head_tokens, *read)
            if k == 0:  # a forward keeping two offsets: the first one's score
                two = tuple(torch.cat([t, torch.randn_like(t)], 1) for t in forward)
                kept = scorer.score_drawn(*two, step.head_tokens, *read)
                torch.testing.assert_close(kept, drawn, rtol=0, atol=0)
            batch = SimpleNamespace(stats=new_batch().stats, state=state)
            called = verifier(None, batch, None, step)
            expected = standalone(verifier, step, state)
            torch.testing.assert_close(drawn, expected, rtol=0, atol=2e-6)
            torch.testing.assert_close(called, expected, rtol=0, atol=2e-6)
            scores.append(drawn)
        return scores

    before = round_scores(state, 10)
    assert torch.stack(before).std(0).max() > 1e-3  # the steps are scored apart
    made = torch.tensor([0.0, 1, 2, 3, 4, 0, 1, 2, 3, 4])
    committed = replace(state, accepted=state.accepted + made, drafted=state.drafted + 4)
    after = round_scores(committed, 10)  # the same steps on the new state
    changed = max(float((a - b).abs().max()) for a, b in zip(after, before, strict=True))
    assert changed > 1e-4  # the acceptance moved the scores, far beyond the tolerance
    committed.accepted.add_(3.0)  # written in place: its version moves
    committed.drafted.mul_(2.0)
    round_scores(committed, 20)


def test_the_graph_path_keeps_nothing_of_the_row_tensors(tmp_path, draft_model) -> None:
    """`apply` is what a captured graph replays on its own input buffers, rewritten in place
    each round (in inference mode, where no write is counted): its score follows the
    buffers' new values."""
    record = write_records(tmp_path / "toy")
    path = export_verifier(tmp_path / "ck", DEFAULT, width(DEFAULT), temperature=0.9)
    verifier = CheckpointVerifier(load_verifier(path), draft_model)
    scorer = verifier.fused
    assert scorer is not None
    rows = list(range(8))
    step, batch = draft_step(record, rows), new_batch(record, rows)
    scorer.bind(None, step.head_q.shape[-1])
    u = torch.rand(len(rows), generator=torch.Generator().manual_seed(3))
    forward = (step.head_q[:, None], step.head_logits[:, None], step.hidden[:, None])
    with torch.inference_mode():
        buffers = tuple(getattr(batch.state, f).clone() for f in scorer.row_fields)
        for grown in (0.0, 2.0, 5.0):
            buffers[1].copy_(batch.state.accepted + grown)  # the round's new state, in place
            buffers[2].copy_(batch.state.drafted + 2 * grown)
            drawn, score = scorer.apply(*forward, u, *buffers)
            state = replace(batch.state, accepted=buffers[1].clone(), drafted=buffers[2].clone())
            redrawn = draft_step(record, rows)
            redrawn.tokens = drawn
            expected = standalone(verifier, redrawn, state)
            torch.testing.assert_close(score, expected, rtol=0, atol=2e-6)


def test_the_row_only_features_read_no_step() -> None:
    """What the host keeps over a round (`ROW_ONLY`) is computed from the row's state alone."""
    state = RowState(
        torch.tensor([0, 3]),
        torch.tensor([1.0, 4.0]),
        torch.tensor([2.0, 9.0]),
        torch.ones(2, 5),
        torch.tensor([0.5, 2.0]),
    )
    inputs = DecodeInputs(None, state, lambda tokens: tokens)  # type: ignore[arg-type]
    for name in ROW_ONLY:
        assert FEATURES[name].row_fields and "run" not in FEATURES[name].row_fields
        assert FEATURES[name].at_decode(inputs, SETTINGS).shape[0] == 2


def test_the_host_recipes_give_their_features_values() -> None:
    """Each scalar the host writes itself is its feature's `at_decode` value (times its
    weight's sign), on the rows that part ways: a tie at the top (margin 0), one finite logit
    (margin inf), -inf logits (0 log 0), float16 logits full of ties, a one-hot q."""
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 300, generator=generator) * 4
    logits[0, 7] = logits[0, 9] = logits[0].max() + 1  # a tie at the top
    logits[1, 1:] = float("-inf")  # one finite logit
    logits[2, ::3] = float("-inf")
    logits[3] = logits[3].half().float().round()  # many ties
    logits[4, :2] = 50.0  # a tie at the top, far above the rest
    q = warp_probs(logits, SamplingConfig(temperature=0.5, top_p=0.9))
    q[5] = torch.nn.functional.one_hot(torch.tensor(11), 300)
    index = inverse_cdf(q, torch.rand(6, generator=generator))
    run = torch.tensor([0, 1, 2, 5, 9, 40])
    active = torch.ones(6, dtype=torch.bool)
    step = DraftStep(index, q, torch.zeros(6, 1), logits, active, head_tokens=index, index=2)
    state = RowState(run, torch.zeros(6), torch.zeros(6), None, None)  # type: ignore[arg-type]
    inputs = DecodeInputs(step, state, lambda tokens: tokens)
    host = HostStep(q, logits, index, run, 2, {"0": torch.tensor(0), "cap": torch.tensor(8)})
    settings = {**SETTINGS, "run_position_cap": 8}
    for name, recipe in HOST_SCALARS.items():
        out = torch.full((6, 1), float("nan"))
        recipe.write(host, out[:, 0] if recipe.flat else out)
        value = FEATURES[name].at_decode(inputs, settings)
        torch.testing.assert_close(recipe.sign * out[:, 0], value, rtol=1e-6, atol=1e-6)
        if name != "draft_entropy_raw":  # the others are the feature's own value, exactly
            assert torch.equal(recipe.sign * out[:, 0], value), name
    assert torch.equal(top2_margin(logits)[[0, 4]], torch.zeros(2))
