"""Records from one teacher-forced forward per model over a padded batch of sequences.

The target's distribution at position t does not depend on the token sampled there, so a
single forward of draft, companion and target over a whole sequence gives q, p and P_c at
every position of its region. At each position t we sample x ~ q_t (the warped draft
distribution) and record SPRINTER's q(x), p(x) (labels q/p <= lam are computed at train
time), SV §4.2's S and A, SVIP §2's draft entropy, and the draft hidden state at t - 1, the
verifier's input (with every other array a feature of decoding/features/table.py declares).
x comes from one core.sampling.sample call per sequence with the prompt's
own generator: the i-th position of a region takes the i-th uniform of its prompt's stream,
whatever else is in the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sprinter_train.core.broken_logits import check_logits
from sprinter_train.core.distributions import acceptance_alpha, entropy
from sprinter_train.core.half import as_record_half
from sprinter_train.core.sampling import SamplingConfig, sample, warp_probs
from sprinter_train.decoding.features.table import (
    AtPosition,
    SequenceHistory,
    feature_columns,
    recorded_arrays,
)
from sprinter_train.harvest.continuations import HarvestSequence
from sprinter_train.harvest.mixes import prompt_seed
from sprinter_train.harvest.schema import numpy_dtypes
from sprinter_train.models.body import body, head_logits
from sprinter_train.models.roles import Roles


def make_generator(seed: int, device: torch.device) -> torch.Generator:
    """The prompt's own generator for its sampled draft tokens (independent of the batch)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


@dataclass
class RecordBatch:
    """Column arrays (one entry per record) and the aligned float16 arrays the features
    declare (`recorded_arrays()`, by name: the draft's hidden state that produced q, the
    target's at the record's last target-verified position, ...)."""

    columns: dict[str, np.ndarray]
    arrays: dict[str, np.ndarray]

    @property
    def rows(self) -> int:
        return int(len(self.columns["position"]))

    def take(self, index: np.ndarray) -> RecordBatch:
        """These rows, in this order (columns and arrays together)."""
        return RecordBatch(
            {k: v[index] for k, v in self.columns.items()},
            {k: v[index] for k, v in self.arrays.items()},
        )


def token_statistics(
    q: torch.Tensor, p: torch.Tensor, c: torch.Tensor | None, x: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Per-row values for sampled tokens x ~ q (so q(x) > 0); c is the companion, or None.

    ratio = q(x)/p(x) is +inf where p(x) = 0 (a token the target never emits), never NaN.
    """
    q_x = q.gather(-1, x[:, None])[:, 0]
    p_x = p.gather(-1, x[:, None])[:, 0]
    stats = {
        "q": q_x,
        "p": p_x,
        "ratio": torch.where(p_x > 0, q_x / p_x, torch.inf),
        "accept_prob": (p_x / q_x).clamp(max=1.0),
        "beta": acceptance_alpha(p, q),
        "draft_entropy": entropy(q),
        "target_entropy": entropy(p),
    }
    if c is not None:
        c_x = c.gather(-1, x[:, None])[:, 0]
        stats["S"] = acceptance_alpha(c, q)
        stats["A"] = (c_x / q_x).clamp(max=1.0)
    return stats


def pad_right(
    sequences: Sequence[HarvestSequence], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right padding keeps every real token at its own position (no position ids needed)."""
    width = max(len(s.input_ids) for s in sequences)
    ids = torch.zeros((len(sequences), width), dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq.input_ids)] = torch.tensor(seq.input_ids, device=device)
        mask[row, : len(seq.input_ids)] = 1
    return ids, mask


def _states(
    model: torch.nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    hidden_layer: int = -1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The final hidden states at (rows, cols) (the head's input) and the chosen layer's."""
    final, chosen, _ = body(model, ids, mask, hidden_layer=hidden_layer)
    return final[rows, cols], chosen[rows, cols]


def _warped(
    model: torch.nn.Module,
    final: torch.Tensor,
    vocab_size: int,
    sampling: SamplingConfig,
    role: str,
    where: Callable[[int], str],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Warped distributions and the raw logits they came from, from final hidden states;
    broken logits (NaN, +inf) stop the harvest naming `role`, the prompt and the position."""
    logits = head_logits(model, final, vocab_size)
    check_logits(logits, role, where)
    return warp_probs(logits, sampling), logits


def draft_runs(from_draft: Sequence[bool]) -> np.ndarray:
    """(len + 1,) at each position t, how many draft-made tokens stand right before t (t up to
    one past the end): the decoder's run position of a draft at t."""
    runs = np.zeros(len(from_draft) + 1, dtype=np.int32)
    for t, drafted in enumerate(from_draft):
        runs[t + 1] = runs[t] + 1 if drafted else 0
    return runs


def target_state_rows(seq: HarvestSequence, runs: np.ndarray) -> np.ndarray:
    """For each record of the sequence (index i of its region, run position runs[i]), the
    index of the record whose target output is the target's state at its last verified
    position, or -1 where there is none.

    A draft at t with run position r follows the non-draft token at t - r - 1, whose
    distribution the target gave at t - r - 2: the output the record at t - r - 1 holds (its
    p is read at t - r - 2). The decoder has such a state only once the target verified a token
    of the row, so a token of the prompt gives none (-1, features zero), as at decode."""
    positions = np.arange(seq.region_start, seq.region_end)
    last = positions - runs - 1  # the last non-draft token before t
    first = max(len(seq.prompt.input_ids), seq.region_start)
    return np.where(last >= first, last - seq.region_start, -1)


def sequence_history(seq: HarvestSequence, accept_prob: np.ndarray) -> SequenceHistory:
    """What came before each of one sequence's records (positions region_start ..
    region_end - 1, `accept_prob` theirs, in order): the run position of each."""
    positions = np.arange(seq.region_start, seq.region_end)
    return SequenceHistory(draft_runs(seq.draft_flags)[positions], accept_prob)


def history_columns(seq: HarvestSequence, accept_prob: np.ndarray) -> dict[str, np.ndarray]:
    """The feature columns filled from one sequence's history (decoding/features/table.py's
    `per_sequence` recipes: the run position of each record, the sum of accept_prob over and
    the count of the sequence's earlier records)."""
    history = sequence_history(seq, accept_prob)
    return {c.name: c.per_sequence(history) for c in feature_columns() if c.per_sequence}


@torch.no_grad()
def harvest_batch(
    models: Roles,
    sequences: Sequence[HarvestSequence],
    sampling: SamplingConfig,
    hidden_layer: int,
    seed: int,
    device: torch.device,
    statistics_rows: int = 32,
) -> RecordBatch:
    """Every record of `sequences`: one forward per model, then per-row statistics.

    The statistics run over whole sequences' regions, about `statistics_rows` records at a
    time: each record holds three full-vocabulary distributions, and on a CPU one block of
    every record at once spends more time faulting in fresh pages than computing. Each row's
    values do not depend on the blocks (every operation is row-wise).
    """
    sequences = [s for s in sequences if s.region_end > s.region_start]
    if not sequences:
        return empty_batch(models)
    ids, mask = pad_right(sequences, device)
    # the distribution of position t is read at t - 1
    rows = torch.cat(
        [torch.full((s.region_end - s.region_start,), i) for i, s in enumerate(sequences)]
    ).to(device)
    cols = torch.cat([torch.arange(s.region_start - 1, s.region_end - 1) for s in sequences]).to(
        device
    )
    draft_final, hidden = _states(models.draft.model, ids, mask, rows, cols, hidden_layer)
    # the target's final state at t - 1 gives p_t (an at_last_verified array: another's)
    target_final, _ = _states(models.target.model, ids, mask, rows, cols)
    companion_final = None
    if models.companion is not None:
        companion_final, _ = _states(models.companion.model, ids, mask, rows, cols)

    def where(offset: int) -> Callable[[int], str]:
        def named(i: int) -> str:
            row, col = int(rows[offset + i]), int(cols[offset + i])
            return f"for prompt {sequences[row].prompt.prompt_id}'s token at position {col + 1}"

        return named

    vocab = models.vocab_size
    arrays = recorded_arrays()
    tokens, blocks, array_blocks = [], [], []
    for group in _groups(sequences, statistics_rows):
        start = sum(s.region_end - s.region_start for s in sequences[: group.start])
        end = start + sum(s.region_end - s.region_start for s in sequences[group])
        span = slice(start, end)
        q, draft_logits = _warped(
            models.draft.model, draft_final[span], vocab, sampling, "draft", where(start)
        )
        p, target_logits = _warped(
            models.target.model, target_final[span], vocab, sampling, "target", where(start)
        )
        c = None
        if companion_final is not None:
            c, _ = _warped(
                models.companion.model,
                companion_final[span],
                vocab,
                sampling,
                "companion",
                where(start),
            )
        x = torch.empty(end - start, dtype=torch.long, device=device)
        offset = 0
        for seq in sequences[group]:
            n = seq.region_end - seq.region_start
            generator = make_generator(prompt_seed(seed, seq.prompt.prompt_id, "records"), device)
            x[offset : offset + n] = sample(q[offset : offset + n], generator)
            offset += n
        tokens.append(x)
        stats_of = token_statistics(q, p, c, x)
        at = AtPosition(q, p, draft_logits, target_logits, x, hidden[span], target_final[span])
        for column in feature_columns():  # at_last_verified ones: moved to that record below
            if column.at_position is not None:
                stats_of[column.name] = column.at_position(at)
        blocks.append({k: v.float().cpu() for k, v in stats_of.items()})
        array_blocks.append({k: as_record_half(a.at_position(at)).cpu() for k, a in arrays.items()})
    x = torch.cat(tokens)
    stats = {name: torch.cat([b[name] for b in blocks]) for name in blocks[0]}
    recorded = {name: torch.cat([b[name] for b in array_blocks]).numpy() for name in arrays}

    counts = [s.region_end - s.region_start for s in sequences]
    columns: dict[str, np.ndarray] = {
        "prompt_id": np.repeat([s.prompt.prompt_id for s in sequences], counts).astype(object),
        "dataset": np.repeat([s.prompt.dataset for s in sequences], counts).astype(object),
        "split": np.repeat([s.prompt.split for s in sequences], counts).astype(object),
        "mix": np.repeat([s.mix for s in sequences], counts).astype(object),
        "position": (cols + 1).cpu().numpy().astype(np.int32),
        "token_id": x.cpu().numpy().astype(np.int32),
    }
    dtypes = numpy_dtypes()
    for name, values in stats.items():
        columns[name] = values.numpy().astype(np.float32).astype(dtypes[name])
    if companion_final is None:
        columns["S"] = np.full(len(x), np.nan, dtype=np.float32)  # written as null
        columns["A"] = np.full(len(x), np.nan, dtype=np.float32)
    bounds = np.cumsum([0, *counts])
    history = [
        sequence_history(seq, columns["accept_prob"][bounds[i] : bounds[i + 1]])
        for i, seq in enumerate(sequences)
    ]
    for column in feature_columns():
        if column.per_sequence is not None:
            columns[column.name] = np.concatenate([column.per_sequence(h) for h in history])
    # the target's state at each record's last verified position: another record's own
    source = np.concatenate(
        [
            np.where(j >= 0, j + bounds[i], -1)
            for i, seq in enumerate(sequences)
            for j in [target_state_rows(seq, history[i].runs)]
        ]
    )
    has = source >= 0
    for column in feature_columns():
        if column.at_last_verified:
            own = columns[column.name]
            columns[column.name] = np.where(has, own[np.maximum(source, 0)], 0).astype(own.dtype)
    for name, array in arrays.items():
        if array.at_last_verified:
            recorded[name] = recorded[name][np.maximum(source, 0)]
            recorded[name][~has] = 0
    columns = {name: columns[name] for name in dtypes}
    return RecordBatch(columns, recorded)


def _groups(sequences: Sequence[HarvestSequence], rows: int) -> list[slice]:
    """Consecutive runs of whole sequences holding about `rows` records each (one sequence's
    region is never split: its draws come from its own stream in order)."""
    groups, start, filled = [], 0, 0
    for i, seq in enumerate(sequences):
        filled += seq.region_end - seq.region_start
        if filled >= rows:
            groups.append(slice(start, i + 1))
            start, filled = i + 1, 0
    if start < len(sequences):
        groups.append(slice(start, len(sequences)))
    return groups


def array_widths(models: Roles) -> dict[str, int]:
    """The width of each recorded array with these models (each `Array.width_of`)."""
    return {name: int(array.width_of(models)) for name, array in recorded_arrays().items()}


def empty_batch(models: Roles) -> RecordBatch:
    return concat_batches([], array_widths(models))


def concat_batches(batches: Sequence[RecordBatch], widths: Mapping[str, int]) -> RecordBatch:
    """Join batches; with none, typed empty columns and (0, width) arrays (`widths`: each
    recorded array's) so an empty shard still has the schema."""
    if not batches:
        columns = {name: np.array([], dtype=dtype) for name, dtype in numpy_dtypes().items()}
        empty = {name: np.zeros((0, width), dtype=np.float16) for name, width in widths.items()}
        return RecordBatch(columns, empty)
    columns = {k: np.concatenate([b.columns[k] for b in batches]) for k in batches[0].columns}
    arrays = {k: np.concatenate([b.arrays[k] for b in batches]) for k in batches[0].arrays}
    return RecordBatch(columns, arrays)
