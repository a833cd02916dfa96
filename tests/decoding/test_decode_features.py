"""Issue #25's decode-time verifier features: each is defined once for records and for the
decoder, and a real decode on tiny models builds, for every drafted token the target kept,
the feature row that the training path builds from the records of the decoded sequence."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from sprinter_train.core.io import write_json
from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt
from sprinter_train.decoding.batch import Batch, DraftStep, Emitted, Round, Row, RowState
from sprinter_train.decoding.builder import build_engine, build_runner
from sprinter_train.decoding.engine import Engine
from sprinter_train.decoding.features.builtins import clipped_run, smoothed_acceptance
from sprinter_train.decoding.policies import Method, Traits, draft_round, verify
from sprinter_train.decoding.runner.runner import RowOutput
from sprinter_train.harvest.continuations import HarvestSequence
from sprinter_train.harvest.reader import OldRecordsError, open_records
from sprinter_train.harvest.records import (
    draft_runs,
    harvest_batch,
    history_columns,
    target_state_rows,
)
from sprinter_train.harvest.schema import SCHEMA_VERSION
from sprinter_train.harvest.shards import ShardPlan, write_shard
from sprinter_train.models.roles import Roles
from sprinter_train.verifier.checkpoint import load_verifier, save_verifier, verifier_path
from sprinter_train.verifier.data import split_features
from sprinter_train.verifier.features import FeatureSpec
from sprinter_train.verifier.scorer import CheckpointVerifier
from tests.decoding_helpers import PACK_EVERY
from tests.harvest_helpers import generating_models
from tests.synthetic import write_synthetic_records

SETTINGS = {"run_position_cap": 3, "accept_prior": 0.5, "accept_n0": 4.0}
NEW = ["draft_margin", "draft_entropy_raw", "run_position", "accept_so_far", "target_margin"]


# -- the definitions on a hand-checked sequence ----------------------------------------------


def test_run_position_counts_the_draft_made_tokens_right_before_each_position() -> None:
    #            t: 0      1      2     3     4      5     6     (7: one past the end)
    from_draft = [False, False, True, True, False, True, True]
    assert draft_runs(from_draft).tolist() == [0, 0, 0, 1, 2, 0, 1, 2]
    # the feature clips at the sidecar's cap, on both sides
    runs = torch.tensor([0, 1, 2, 5, 9])
    assert clipped_run(runs, 3).tolist() == [0.0, 1.0, 2.0, 3.0, 3.0]


def test_history_columns_of_a_hand_checked_sequence() -> None:
    prompt = Prompt("p", "toy", "test", "", [7, 8], None)
    ids = [7, 8, 1, 2, 3, 4, 5]
    flags = (False, False, True, True, False, True, True)
    sequence = HarvestSequence(prompt, "interleaved", ids, 2, 7, flags)
    accept = np.array([0.5, 1.0, 0.25, 1.0, 0.75], dtype=np.float32)
    columns = history_columns(sequence, accept)
    assert columns["run_position"].tolist() == [0, 1, 2, 0, 1]
    assert columns["drafts_before"].tolist() == [0, 1, 2, 3, 4]
    assert columns["accepted_before"].tolist() == [0.0, 0.5, 1.5, 1.75, 2.75]
    # (accepted + n0 prior) / (drafts + n0) at n0 = 4, prior = 0.5
    smoothed = smoothed_acceptance(
        torch.from_numpy(columns["accepted_before"]),
        torch.from_numpy(columns["drafts_before"]),
        0.5,
        4.0,
    )
    expected = [2 / 4, 2.5 / 5, 3.5 / 6, 3.75 / 7, 4.75 / 8]
    assert smoothed.tolist() == pytest.approx(expected)
    # staleness: t=2 (r 0) follows the prompt's token 8: no target state; t=3, 4 (r 1, 2)
    # too; t=5 (r 0) follows the non-draft 3 at t=4, whose p the target gave at 3 (the record
    # of t=4, index 2); t=6 (r 1) reads that same state, one position older than its own
    rows = target_state_rows(sequence, columns["run_position"])
    assert rows.tolist() == [-1, -1, -1, 2, 2]


def test_the_rows_state_follows_what_each_round_commits() -> None:
    """Row 0: SD kept 2 of 3 drafts and the target's correction ends the round (run 0);
    row 1: a verifier trusted all 3 drafts (the run goes on); row 2: SPRINTER's target check
    kept the draft it was asked about (a draft as drawn: the run goes on)."""
    state = RowState(
        torch.tensor([0, 4, 1]),
        torch.tensor([1.0, 2.0, 0.0]),
        torch.ones(3),
        torch.zeros(3, 2),
        torch.zeros(3),
    )
    emitted = Emitted(
        tokens=torch.zeros(3, 4, dtype=torch.long),
        lengths=torch.tensor([3, 3, 2]),
        kept=torch.tensor([2, 3, 1]),
        drafted=torch.tensor([3, 3, 2]),
        accepted=torch.tensor([2, 0, 1]),
        verifier_accepted=torch.tensor([0, 3, 1]),
    )
    # the round's target forward: offset i gave emitted token i's distribution
    final = torch.arange(3 * 4 * 2, dtype=torch.float32).reshape(3, 4, 2)
    logits = torch.zeros(3, 4, 5)
    logits[0, 2, :2] = torch.tensor([4.0, 1.5])  # row 0's correction came from offset 2
    verified = RowOutput(logits, final, final=final)
    after = state.after(emitted, verified)
    assert after.run.tolist() == [0, 7, 3]
    assert after.accepted.tolist() == [3.0, 5.0, 2.0]
    assert after.drafted.tolist() == [4.0, 4.0, 3.0]
    assert after.target_hidden[0].tolist() == final[0, 2].tolist()  # rows 1, 2 keep theirs
    assert after.target_hidden[1:].abs().sum() == 0 and after.target_margin.tolist() == [2.5, 0, 0]


# -- older records are refused -----------------------------------------------------------------


def test_records_of_an_older_schema_are_refused_naming_the_harvest(tmp_path: Path) -> None:
    written = write_synthetic_records(tmp_path / "old", rows=64, d=8, positions=16)
    assert open_records(tmp_path / "old").frame.shape[0] == 64
    manifest = dict(written["manifest"], schema_version=SCHEMA_VERSION - 1)
    write_json(written["records_dir"] / "manifest.json", manifest)
    with pytest.raises(OldRecordsError, match=r"schema version 1.*stage=harvest experiment=old"):
        open_records(tmp_path / "old", stage="stage=train")


# -- a real decode against the training path ---------------------------------------------------


@dataclass
class Recording(Method):
    """Speculative decoding with `gamma` drafts a round that keeps, for each draft the target
    accepted and for its first rejected one (their prefixes are the output's), the scorer's
    feature row, its row and position, and the acceptance the row's counts so far give."""

    traits: ClassVar[Traits] = Traits(
        lossless=True,
        greedy_exact=True,
        needs=frozenset(),
        law_computed=False,
        exports=False,
        rivals=(),
        record_score=None,
    )

    verifier: CheckpointVerifier  # so named, the engine keeps the rows' state for it
    gamma: int
    seen: list[tuple[int, int, torch.Tensor, float]] = field(default_factory=list)
    name: str = "recording"

    def round(self, engine: Engine, batch: Batch) -> Emitted:
        drawn: list[tuple[DraftStep, torch.Tensor]] = []

        def stop(step: DraftStep) -> torch.Tensor:
            drawn.append((step, self.verifier.features(step, batch.state)))
            return torch.zeros_like(step.active)

        rnd = draft_round(engine, batch, batch.room(self.gamma), stop, rnd=Round())
        emitted = verify(engine, batch, rnd)
        for r, row in enumerate(batch.rows):
            counts = row.memory.get("counts", (0, 0))
            so_far = (counts[0] + 4 * 0.5) / (counts[1] + 4)
            for step, rows in drawn:
                if bool(step.active[r]) and step.index <= int(emitted.accepted[r]):
                    position = len(row.tokens) + step.index
                    self.seen.append((row.index, position, rows[r], so_far))
        return emitted

    def update(self, row: Row, drafted: int, accepted: int) -> None:
        accepted_so_far, drafted_so_far = row.memory.get("counts", (0, 0))
        row.memory["counts"] = (accepted_so_far + accepted, drafted_so_far + drafted)


def write_one_shard(experiment_dir: Path, sequences: list[HarvestSequence], models: Roles) -> None:
    """The decoded sequences' records, written and described as the harvest writes them."""
    batch = harvest_batch(models, sequences, SamplingConfig(), -1, 0, torch.device("cpu"))
    plan = ShardPlan(0, tuple(s.prompt for s in sequences), tuple(s.mix for s in sequences))
    records_dir = experiment_dir / "records"
    records_dir.mkdir(parents=True)
    write_shard(records_dir, plan, batch, sequences, "decoded")
    manifest: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "experiment": experiment_dir.name,
        "hidden": {"layer": -1, "d": batch.arrays["hidden"].shape[1], "dtype": "float16"},
        "target_hidden": {"d": batch.arrays["target_hidden"].shape[1], "dtype": "float16"},
        "shards": [{"name": plan.name, "rows": batch.rows}],
    }
    write_json(records_dir / "manifest.json", manifest)


def test_decoding_builds_the_feature_rows_training_builds(tmp_path: Path) -> None:
    models = generating_models("llama", None)
    draft, target = models.draft.model, models.target.model
    names = ["hidden", "target_hidden", *NEW]
    d, d_t = int(draft.config.hidden_size), int(target.config.hidden_size)
    width = d + d_t + len(NEW)
    weight, bias = torch.randn(width) / width**0.5, torch.zeros(1)
    meta = {"lam": 1.0, "features": {"names": names, "settings": SETTINGS}}
    checkpoint = load_verifier(
        save_verifier(verifier_path(tmp_path / "ck", 1.0), weight, bias, meta)
    )
    scorer = CheckpointVerifier(checkpoint, draft)
    sampling = SamplingConfig(temperature=0.9, top_k=20)
    engine = build_engine(
        build_runner(target, 128),
        sampling,
        128,
        draft=build_runner(draft, 128),
        pack_every=PACK_EVERY,
    )
    prompts = [[5, 17, 9, 33], [40, 41, 42, 43, 44, 45, 46], [7, 8, 60]]
    policy = Recording(scorer, gamma=4)
    results = engine.generate(prompts, policy, 20, seeds=[3, 4, 5])

    sequences = []
    for i, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
        assert len(result.from_draft) == len(result.tokens)
        flags = (False,) * len(prompt) + tuple(result.from_draft)
        sequences.append(
            HarvestSequence(
                Prompt(f"p{i}", "toy", "test", "", prompt, None),
                "interleaved",
                prompt + result.tokens,
                len(prompt),
                len(prompt) + len(result.tokens),
                flags,
            )
        )
    write_one_shard(tmp_path / "decoded", sequences, models)
    records = open_records(tmp_path / "decoded")
    spec = FeatureSpec.from_names(names, SETTINGS)
    features, rows = split_features(records, None, spec)
    trained = features.batch()
    where = {
        (pid, int(t)): i
        for i, (pid, t) in enumerate(
            zip(records.frame["prompt_id"].to_numpy()[rows], records.frame["position"], strict=True)
        )
    }
    s = d + d_t  # the scalars: margin, raw entropy, run position, acceptance, target margin
    assert any(row[2][s + 2] > 0 for row in policy.seen)  # runs longer than one are checked
    assert any(row[2][d:s].abs().sum() > 0 for row in policy.seen)  # target states are too
    assert any(row[2][d:s].abs().sum() == 0 for row in policy.seen)  # and first rounds
    assert len(policy.seen) > 20 and any(f for r in results for f in r.from_draft)
    for row, position, decoded, so_far in policy.seen:
        record = trained[where[(f"p{row}", position)]]
        # dense blocks are float16 of states the decoder's cached steps and the harvest's
        # teacher-forced pass compute apart by float32 rounding: one float16 step at most
        torch.testing.assert_close(decoded[:s], record[:s], rtol=0, atol=4e-3)
        torch.testing.assert_close(decoded[s : s + 3], record[s : s + 3], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(decoded[s + 4], record[s + 4], rtol=1e-4, atol=1e-4)
        # the same definition, from the decoder's 0/1 outcomes and the records' min(1, p/q)
        assert float(decoded[s + 3]) == pytest.approx(so_far, abs=1e-6)
