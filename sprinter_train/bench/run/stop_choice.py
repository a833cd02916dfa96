"""sd_learned's stop rule, chosen at every batch size before the timed runs.

A learned length whose config says `stop_rule: auto` has its rule family and threshold
chosen on the experiment's records of `bench.stop_rules.split` (val by default: the test
split is what the bench times), by the modelled tokens a second of
decoding/policies/plans/stop_rules.py at this run's latency profile, batch size by batch
size; `none` (target-only rounds) is a candidate, so at a batch size where drafting does not
pay the method falls back to target_only. The choice and every candidate's modelled rate go
to results.json (the method's `settings.stop_rule`) and results.md. During the run the choice
is made again every `bench.stop_rules.every` rounds at the engine's running timings
(`StopRules`), which the run's own forwards correct.

Without records (a bench of checkpoints whose harvest is gone) or with a verifier that has
no checkpoint (the online logistic), the goodput rule stands, and the settings say why.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from omegaconf import DictConfig

from sprinter_train.bench.timing.latency import LatencyProfile
from sprinter_train.core.io import MissingInputError
from sprinter_train.decoding.batch import Policy
from sprinter_train.decoding.policies.learned import LearnedLength
from sprinter_train.decoding.policies.plans.stop_rules import (
    StopRules,
    Windows,
    candidates,
    choose,
)
from sprinter_train.harvest.reader import open_records
from sprinter_train.verifier.checkpoint import VerifierCheckpoint
from sprinter_train.verifier.data import rows_features
from sprinter_train.verifier.embedder import make_embedder

log = logging.getLogger(__name__)

AUTO = "auto"
MIX = "draft"  # the records whose drafts the draft drew from q, as an sd round's are
COLUMNS = ("prompt_id", "split", "mix", "position", "accept_prob")  # what a round start reads


def choose_stop_rules(
    cfg: DictConfig,
    policies: dict[str, Policy],
    settings: dict[str, dict[str, Any]],
    profile: LatencyProfile,
    batch_sizes: Sequence[int],
) -> None:
    """Give every learned length whose config asks for it (`stop_rule: auto`) its rule at
    each of `batch_sizes`, in `policies` and `settings` (what results.json records)."""
    for name, policy in list(policies.items()):
        if not isinstance(policy, LearnedLength) or cfg.methods[name].get("stop_rule") != AUTO:
            continue
        checkpoint = getattr(policy.verifier, "checkpoint", None)
        if not isinstance(checkpoint, VerifierCheckpoint):
            settings[name]["stop_rule"] = {"rule": "goodput", "why": "no checkpoint to score"}
            continue
        windows, why = record_windows(cfg, checkpoint, policy.max_gamma)
        if windows is None:
            settings[name]["stop_rule"] = {"rule": "goodput", "why": why}
            log.warning("bench: %s keeps the goodput rule: %s", name, why)
            continue
        grid = cfg.bench.stop_rules
        rules = candidates(list(grid.product), list(grid.hazard))
        drafting = ("draft",) if policy.table is None else ("draft", "companion")
        chosen, records = {}, {}
        for size in batch_sizes:
            choice = choose(
                windows,
                size,
                profile.target_batch_s,
                lambda rows, drafting=drafting: step_seconds(profile, rows, drafting),
                rules,
                seed=int(cfg.bench.seed),
            )
            chosen[size], records[str(size)] = choice.rule, choice.record()
            log.info(
                "bench: %s stops by %s at batch %d (%.1f modelled tokens/s)",
                name,
                choice.rule.describe(),
                size,
                choice.rates[choice.rule.describe()],
            )
        every = int(grid.every)
        rules_of = StopRules(chosen, windows if every else None, tuple(rules), every or 1)
        policies[name] = dataclasses.replace(policy, stop_rule=rules_of)
        settings[name]["stop_rule"] = {
            "chosen_on": f"{cfg.bench.stop_rules.split} records of the {MIX} mix",
            "round_starts": len(windows),
            "rechosen_every": every,  # rounds; 0: the profile's choice stands
            "by_batch": records,
            "rounds_by_rows_and_rule": rules_of.rounds,  # filled while the run decodes
        }


def step_seconds(profile: LatencyProfile, rows: int, drafting: tuple[str, ...]) -> float:
    """One drafting step over the models in `drafting` at `rows` rows, from the profile."""
    ms = profile.draft_batch_ms(rows)
    if "companion" in drafting:
        ms += profile.companion_batch_ms(rows)
    return ms / 1e3


def record_windows(
    cfg: DictConfig, checkpoint: VerifierCheckpoint, gamma_max: int
) -> tuple[Windows | None, str]:
    """The round starts of the split's draft-mix records, with the checkpoint's calibrated
    scores (None and why, when the experiment has no such records)."""
    split, spec = str(cfg.bench.stop_rules.split), checkpoint.spec
    columns = list(dict.fromkeys([*COLUMNS, *spec.record_columns()]))
    try:
        records = open_records(cfg.experiment_dir, columns, stage="stage=bench", verify=False)
    except MissingInputError as error:  # a corrupt record set is refused, not skipped
        return None, f"no records to choose on ({error})"
    if int(checkpoint.meta.get("d", records.d)) != records.d:
        return None, f"the records' hidden width {records.d} is not its verifier's"
    frame = records.frame
    rows = np.flatnonzero(((frame.split == split) & (frame.mix == MIX)).to_numpy())
    if not len(rows):
        return None, f"the records hold no {split} rows of the {MIX} mix"
    features = rows_features(records, rows, spec, make_embedder(cfg, spec, records))
    score = np.asarray(checkpoint.calibrated(checkpoint.logits(features.batch())), dtype=float)
    part = frame.iloc[rows].assign(score=score).sort_values(["prompt_id", "position"])
    sequences = [
        (g.accept_prob.to_numpy(float), g.score.to_numpy(float))
        for _, g in part.groupby(["prompt_id", "mix"], sort=False)
    ]
    return Windows.of(sequences, gamma_max), ""
