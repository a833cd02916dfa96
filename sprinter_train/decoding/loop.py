"""The engine's generation loop: a batch of rows, the commit that ends each round, and
`generate`, which runs a policy's rounds until every row is done.

`Engine` (engine.py) inherits it: there the operations policies use within a round (draft,
companion, verify), here what happens between rounds. One transfer a round brings the host
its outcome; rows cut at EOS and their budget leave the batch, and the caches drop the
slots a round did not keep.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING

import torch

from sprinter_train.core.runtime import synchronize
from sprinter_train.core.streams import RowStreams
from sprinter_train.decoding.batch import (
    Batch,
    Emitted,
    GenerationResult,
    Policy,
    Row,
    RowState,
)
from sprinter_train.decoding.features.table import FEATURES
from sprinter_train.decoding.runner.runner import ModelRunner

if TYPE_CHECKING:
    from sprinter_train.decoding.timings import Timings

CAPACITY_SLACK = 16  # slots a static cache holds past prompt + budget (drafts past the budget)


class RoundLoop:
    """What the engine does between rounds (the attributes below are the engine's)."""

    runners: dict[str, ModelRunner | None]
    present_runners: dict[str, ModelRunner]
    timings: Timings
    eos_token_id: int | None
    pack_every: int
    device: torch.device
    target_dim: int
    _pending: tuple[torch.Tensor, torch.cuda.Event] | None
    tensor: Callable[[Sequence[int]], torch.Tensor]  # host ints to a device tensor

    def new_batch(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, seeds: Sequence[int]
    ) -> Batch:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("a prompt needs at least one token")
        rows = [Row(i, list(p), len(p), max_new_tokens) for i, p in enumerate(prompts)]
        for row in rows:
            row.finished = max_new_tokens <= 0
        roles = list(self.present_runners)
        capacity = max(len(p) for p in prompts) + max(max_new_tokens, 0) + CAPACITY_SLACK
        return Batch(
            rows,
            RowStreams(list(seeds), self.device),
            {r: self.runners[r].new_cache(len(rows), capacity) for r in roles},
            {r: [0] * len(rows) for r in roles},
            state=RowState.empty(len(rows), self.target_dim, self.device),
        )

    def commit(self, batch: Batch, emitted: Emitted, policy: Policy | None = None) -> None:
        """One transfer: the round's tokens and the caches' lengths; then cut each row at EOS
        and its budget, drop the cache slots past what was kept, and let finished rows go."""
        self._pending = None
        if batch.state is not None:
            batch.state = batch.state.after(emitted, batch.verified)
        batch.verified = None
        committed = [len(row.tokens) for row in batch.rows]
        valid = self.tensor(committed) + emitted.kept
        for cache in batch.caches.values():
            cache.truncate(valid, min(committed))
        roles = list(batch.caches)
        counts = [getattr(emitted, name) for name in Emitted.COUNTS]
        columns = torch.stack(
            [emitted.lengths]
            + [torch.zeros_like(emitted.lengths) if c is None else c for c in counts]
            + [batch.caches[r].lengths for r in roles]
            + [self.runners[r].nonfinite_position().expand(len(batch)) for r in roles],
            dim=1,
        )
        packet = torch.cat([emitted.tokens, columns], dim=1).tolist()
        batch.stats.rounds += 1
        width = emitted.tokens.shape[1]
        ModelRunner.raise_nonfinite(roles, packet[0][width + 4 + len(roles) :])
        for r, (row, values) in enumerate(zip(batch.rows, packet, strict=True)):
            drafted, accepted, by_verifier = values[width + 1 : width + 4]
            batch.stats.drafted += drafted
            batch.stats.accepted += accepted
            batch.stats.verifier_accepted += by_verifier
            batch.stats.row_rounds += 1
            batch.stats.drafting_rounds += int(drafted > 0)
            batch.stats.full_rounds += int(0 < drafted == accepted)
            if policy is not None:
                policy.update(row, drafted, accepted)
            room = values[: values[width]][: row.remaining]
            if self.eos_token_id is not None and self.eos_token_id in room:
                room = room[: room.index(self.eos_token_id) + 1]
                row.finished = True
            made = accepted + by_verifier  # the leading drafts, committed as drawn
            row.from_draft.extend(k < made for k in range(len(room)))
            row.tokens.extend(room)
            if row.remaining <= 0:
                row.finished = True
            for k, role in enumerate(roles):
                batch.held[role][r] = values[width + 4 + k]
        live = [r for r, row in enumerate(batch.rows) if not row.finished]
        if len(live) < len(batch.rows) and live:
            index = self.tensor(live)
            for cache in batch.caches.values():
                cache.select(index)
            batch.streams = batch.streams.select(index)
            if batch.state is not None:
                batch.state = batch.state.select(index)
            batch.rows = [batch.rows[r] for r in live]
            batch.held = {role: [h[r] for r in live] for role, h in batch.held.items()}
        due = batch.stats.rounds % self.pack_every == 0
        for role, cache in batch.caches.items():
            if cache.crowded() or due:  # a static cache near its capacity packs early
                cache.pack(max(batch.held[role]), min(batch.held[role]))

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        policy: Policy,
        max_new_tokens: int,
        seeds: Sequence[int] | None = None,
    ) -> list[GenerationResult]:
        """Decode every prompt with `policy` until EOS or `max_new_tokens`; row i uses
        seeds[i] (default i). Wall time covers the whole batch."""
        seeds = list(range(len(prompts))) if seeds is None else list(seeds)
        batch = self.new_batch(prompts, max_new_tokens, seeds)
        read = row_fields_read(policy)
        if not read:
            batch.state = None  # nothing reads the rows' history: commit keeps none
        elif batch.state is not None:
            batch.state = batch.state.only(read)  # commit keeps what is read alone
        done = list(batch.rows)
        roles = list(self.present_runners)
        synchronize(self.device)
        before = {role: self.runners[role].seconds for role in roles}
        prefilled = {role: self.runners[role].prefill_seconds for role in roles}
        compiling = sum(self.runners[role].compile_seconds for role in roles)
        start = time.perf_counter()
        while batch.rows and not all(row.finished for row in batch.rows):
            self.timings.feed(self.runners)  # the earlier rounds' forwards, before planning
            self.commit(batch, policy.round(self, batch), policy)
        synchronize(self.device)
        compiling = sum(self.runners[role].compile_seconds for role in roles) - compiling
        wall = time.perf_counter() - start - compiling  # compile time is reported apart
        wall -= batch.stats.unbilled_seconds  # an oracle's look-ahead (policies/oracle.py)
        batch.stats.compile_seconds = compiling
        for role in roles:  # CUDA events are read here, after the clock stopped
            spent = self.runners[role].seconds - before[role]
            spent -= getattr(batch.stats, f"unbilled_{role}_seconds", 0.0)
            setattr(batch.stats, f"{role}_seconds", spent)
            prefill = self.runners[role].prefill_seconds - prefilled[role]
            setattr(batch.stats, f"{role}_prefill_seconds", prefill)
        self.timings.feed(self.runners)  # every forward is done: none is left for later
        return [GenerationResult(row.generated, wall, batch.stats, row.from_draft) for row in done]


def row_fields_read(policy: object) -> frozenset[str]:
    """The `Batch.state` fields `policy` reads: those its verifier's features of the row's
    history name (their `row_fields`), every field for a verifier that names no features
    (it may read anything), none without a verifier. Each field kept costs the engine device
    ops a round (the target's: gathers of its hidden states, a top-2 over the vocabulary),
    launched on a GPU whether anything reads it or not."""
    verifier = getattr(policy, "verifier", None)
    if verifier is None:
        return frozenset()
    names = getattr(getattr(verifier, "spec", None), "names", None)
    if names is None:
        return frozenset(f.name for f in fields(RowState))
    return frozenset(f for n in names for f in FEATURES[n].row_fields)
