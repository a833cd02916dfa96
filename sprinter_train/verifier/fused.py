"""A linear verifier's score in the draft step, at a hand rule's cost.

The standalone path (`CheckpointVerifier.features`) builds the whole feature vector, as
training does: every block cast to float16 and back, the scalars stacked, the pieces
concatenated, then one product with the weights. At decode time that is most of a learned
round's host work (benchmarks/host_ops.py counted 84 ops a forward for sd_learned against
46 for svip) and, on the CPU, a quarter of a drafting step. A linear head does not need the
vector: w . s + b is the sum of each block's own product, so

- a dense block of the step (the draft's hidden state) is one product with its slice of w,
  after the same float16 rounding records give it;
- the drafted token's embedding block is a lookup: its product with the embedding slice of
  w is one number per vocabulary id, computed once (`token_table`);
- the scalars are computed by their features' own `at_decode` (feature_table.py: the same
  code as the standalone path) and weighed by one product;
- the calibration temperature is folded into the weights.

It is also a `StepScorer` (decoding/runner/after_warp.py): `apply` draws the step's token and
scores it from the step's own outputs, so a draft runner that captures its forwards records
the score in the step's graph (`DrawScore`), and any other runner's caller runs the same
`apply` after the forward.

On the host (a CPU draft: no graph, every op paid eagerly, and a round scores each draft by
itself) the score takes a leaner path, `_host_score`, since there an op costs microseconds
whatever its size and the number of ops is the price:

- the step's parts are written by their own `out=` ops into one preallocated row of columns
  (the embedding table's value, the float16-rounded hidden state, each scalar) and weighed by
  one product, with no stack, cast or view of its own (`HostRows`);
- the features of the row's state alone (`ROW_ONLY`: the acceptance so far, the target's
  state) change only when a round commits, which gives the state's fields new tensors
  (`RowState.after`), so their part of the score, with the bias, is computed once per state
  and reused over the round's steps (`_row_part`, keyed on those tensors' identity);
- the raw logits' entropy is -sum(p * log p) over one `log_softmax` (the log vectorised,
  where `entr` takes a scalar log of each of the K probabilities), its sign in the weight,
  the feature's value up to float32 rounding; the margin is the max less the max of the
  rest, exactly topk's.

The sum is the standalone score up to float32's rounding of a different summation order
(tests/verifier/test_fused_score.py holds them together).
"""

from __future__ import annotations

from dataclasses import fields
from typing import ClassVar

import torch

from sprinter_train.core.half import FLOAT16_MAX, as_record_half
from sprinter_train.core.sampling import inverse_cdf
from sprinter_train.decoding.batch import DraftStep, RowState
from sprinter_train.decoding.features.table import FEATURES, DecodeInputs, dense_features
from sprinter_train.verifier.fused_host import (
    HIDDEN,
    HOST_SCALARS,
    HostRows,
    HostStep,
    unchanged,
    version_of,
)

EMBEDDING = "token_embedding"
TABLE_CHUNK = 4096  # vocabulary ids embedded at once while the table is built
# the features whose `at_decode` reads the row's state alone, never the step: the engine
# writes their RowState fields only when a round commits, as new tensors (`RowState.after`),
# so their part of the score holds over a round's steps (`FusedLinearScore._row_part`)
ROW_ONLY = frozenset({"accept_so_far", "target_hidden", "target_margin"})
STATE_FIELDS = tuple(f.name for f in fields(RowState))


class FusedLinearScore:
    """sigmoid((w . s + b) / T) of a linear verifier, block by block (see the module)."""

    reads_forward: ClassVar[bool] = True
    fields: ClassVar[tuple[str, ...]] = ("drawn", "score")

    def __init__(
        self,
        weight: torch.Tensor,
        bias: float,
        temperature: float,
        names: tuple[str, ...],
        settings: dict[str, float],
        embedding: torch.nn.Module,
        source: str = "the verifier",
    ) -> None:
        self.source = source  # what an error names: the checkpoint's path
        self.weight = weight.detach().float() / temperature
        self.bias = bias / temperature
        self.names = names
        self.settings = settings
        self.embedding = embedding
        self.dense = tuple(n for n in names if n in dense_features())
        self.scalars = tuple(n for n in names if n not in dense_features())
        self._device: torch.device | None = None
        self._blocks: dict[str, torch.Tensor] = {}
        self._scalar_weight = torch.zeros(0)
        self._table: torch.Tensor | None = None
        self.row_fields = tuple(
            dict.fromkeys(f for n in names for f in FEATURES[n].row_fields)
        )  # what `apply` takes after the uniforms, in this order
        self.support: torch.Tensor | None = None
        self.vocab_size = 0
        self.row_only = tuple(n for n in names if n in ROW_ONLY)
        self.step_scalars = tuple(n for n in self.scalars if n not in ROW_ONLY)
        # whether the host path (`_host_score`) computes every feature of the verifier, on
        # a CPU (else the path a GPU step records, everywhere)
        self.host = all(
            n in ROW_ONLY or n in (HIDDEN, EMBEDDING) or n in HOST_SCALARS for n in names
        )
        self._row_fields_read = tuple(
            dict.fromkeys(f for n in self.row_only for f in FEATURES[n].row_fields)
        )
        self._host_weight = torch.zeros(0)  # the columns' weights (`HostRows`' layout)
        self._host_rows: dict[int, HostRows] = {}
        self._head_table: torch.Tensor | None = None  # the table on the bound head's ids
        # the row tensors `_row_base` was computed from: (field, tensor, version) each
        self._row_kept: tuple[tuple[str, torch.Tensor, int | None], ...] | None = None
        self._row_base = torch.zeros(0)
        self._bias = torch.zeros(())
        self._row_weights: dict[str, float] = {}  # the ROW_ONLY scalars' weights
        self._bounds: dict[str, torch.Tensor] = {}

    def bind(self, support: torch.Tensor | None, vocab_size: int) -> None:
        """The draft head's tokens (a restricted head's ids; None: the vocabulary), which
        `apply`'s drawn head indices map to."""
        if support is not self.support:
            self._head_table = None
        self.support, self.vocab_size = support, vocab_size

    def apply(
        self,
        probs: torch.Tensor,
        logits: torch.Tensor,
        hidden: torch.Tensor,
        u: torch.Tensor,
        *state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(drawn, score): `Draw`'s token at u from the step's first kept offset (probs,
        logits (rows, 1, K), hidden (rows, 1, d)) and its score, the row tensors `state`
        given in `row_fields` order (the run already counting the round's earlier drafts).

        What a captured graph records and replays on its own input buffers, rewritten in
        place each round (`HostGraph` on the host too): the score keeps nothing of the
        row tensors from one call to the next."""
        drawn = inverse_cdf(probs[:, 0], u)
        return drawn, self._score_drawn(probs, logits, hidden, drawn, state, reuse=False)

    def score_drawn(
        self,
        probs: torch.Tensor,
        logits: torch.Tensor,
        hidden: torch.Tensor,
        drawn: torch.Tensor,
        *state: torch.Tensor,
    ) -> torch.Tensor:
        """(rows,) the score of the head index `drawn` a row (see `apply`), called eagerly
        (`DrawScore.score`): on the host the row state's part is kept across the calls of a
        round (`_row_part`)."""
        return self._score_drawn(probs, logits, hidden, drawn, state, reuse=True)

    def _score_drawn(
        self,
        probs: torch.Tensor,
        logits: torch.Tensor,
        hidden: torch.Tensor,
        drawn: torch.Tensor,
        state: tuple[torch.Tensor, ...],
        reuse: bool,
    ) -> torch.Tensor:
        if self.host and hidden.device.type == "cpu":
            given = dict(zip(self.row_fields, state, strict=True))
            if probs.shape[1] != 1:  # the first kept offset's alone (a step keeps one)
                probs, logits, hidden = probs[:, :1], logits[:, :1], hidden[:, :1]
            return self._host_score(probs, logits, hidden, drawn, None, given, 0, reuse)
        tokens = drawn if self.support is None else self.support[drawn]
        step = DraftStep(
            tokens,
            probs[:, 0],
            hidden[:, 0],
            logits[:, 0],
            None,  # type: ignore[arg-type]  # no feature reads which rows are active
            self.support,
            self.vocab_size,
            head_tokens=drawn,
        )
        given = dict(zip(self.row_fields, state, strict=True))
        rows = RowState(**{f.name: given.get(f.name) for f in fields(RowState)})
        return self(step, rows)

    def __call__(self, step: DraftStep, state: RowState | None) -> torch.Tensor:
        """(B,) the calibrated score of each row's drafted token."""
        if self.host and step.hidden.device.type == "cpu":
            given = {} if state is None else {f: getattr(state, f) for f in self.row_fields}
            index = step.tokens if step.head_tokens is None else step.head_tokens
            return self._host_score(
                step.head_q,
                step.head_logits,
                step.hidden,
                index,
                step.tokens,
                given,
                step.index,
                reuse=True,
            )
        inputs = DecodeInputs(step, state, self.embedding)
        parts = {
            n: FEATURES[n].at_decode(inputs, self.settings) for n in self.dense if n != EMBEDDING
        }
        if self._device != step.hidden.device:
            self._place(step.hidden.device, {n: int(p.shape[-1]) for n, p in parts.items()})
        # each block's product added in one op (addmv), no cast of what is float32 already:
        # on a CPU an eager op costs microseconds whatever its size, the most of this sum
        z = None if self._table is None else self._table[step.tokens]
        for name, block in parts.items():
            z = _add_product(z, record_half(block), self._blocks[name])
        if self.scalars:
            columns = [_float(FEATURES[n].at_decode(inputs, self.settings)) for n in self.scalars]
            z = _add_product(z, torch.stack(columns, 1), self._scalar_weight)
        assert z is not None  # a verifier reads at least one feature
        return torch.sigmoid(z + self.bias)

    @torch.inference_mode()
    def _place(self, device: torch.device, widths: dict[str, int]) -> None:
        """Cut the weights into the blocks of the vector's layout (dense blocks in order, then
        the scalars), on `device`, and build the embedding table."""
        if EMBEDDING in self.dense:
            widths[EMBEDDING] = int(self.embedding(torch.zeros(1, dtype=torch.long)).shape[-1])
        sizes = [widths[n] for n in self.dense] + [len(self.scalars)]
        if sum(sizes) != self.weight.numel():
            raise ValueError(
                f"verifier {self.source} expects {self.weight.numel()} features, the draft "
                f"gives {sum(sizes)} ({dict(zip(self.dense, sizes, strict=False))} and "
                f"{len(self.scalars)} scalars): was it trained on this draft's records?"
            )
        pieces = self.weight.to(device).split(sizes)
        self._blocks = {n: pieces[i] for i, n in enumerate(self.dense)}
        self._scalar_weight = pieces[-1]
        self._table = None
        if EMBEDDING in self._blocks:
            self._table = token_table(self.embedding, self._blocks.pop(EMBEDDING), device)
        self._device = device
        self._host_rows, self._head_table, self._row_kept = {}, None, None
        if self.host and device.type == "cpu":
            self._place_host(device)

    def _place_host(self, device: torch.device) -> None:
        """The host path's weights, in `HostRows`' column order: 1 for the embedding table's
        value, the hidden block, then each scalar of the step with its recipe's sign."""
        parts = [] if self._table is None else [torch.ones(1, device=device)]
        if HIDDEN in self._blocks:
            parts.append(self._blocks[HIDDEN])
        for name in self.step_scalars:
            i = self.scalars.index(name)
            parts.append(HOST_SCALARS[name].sign * self._scalar_weight[i : i + 1])
        self._host_weight = torch.cat(parts) if parts else torch.zeros(0, device=device)
        self._row_weights = {
            n: float(self._scalar_weight[self.scalars.index(n)])
            for n in self.row_only
            if n not in self.dense
        }
        with torch.inference_mode(False):  # plain tensors: read by either mode's callers
            self._bias = torch.tensor(self.bias, device=device)
            cap = int(self.settings.get("run_position_cap", 0))
            self._bounds = {
                "0": torch.tensor(0, device=device),
                "cap": torch.tensor(cap, device=device),
            }

    def _host_score(
        self,
        q: torch.Tensor,
        logits: torch.Tensor,
        hidden: torch.Tensor,
        index: torch.Tensor,
        tokens: torch.Tensor | None,
        rows: dict[str, torch.Tensor],
        offset: int,
        reuse: bool,
    ) -> torch.Tensor:
        """(B,) the score on the host (see the module): q and logits (B, K), hidden (B, d),
        or each (B, 1, ...) (a step's one kept offset: no view of ours to drop it),
        `index` (B,) each drawn token's index into q, `tokens` their vocabulary ids (None: the
        bound head's ids at `index`), `rows` the row tensors by RowState field (the run
        without the round's `offset`-th step counted); `reuse`: the row state's part may
        be the one computed for the same row tensors before."""
        if self._device != hidden.device:
            widths = {HIDDEN: hidden, **rows}  # the dense blocks: the step's and the rows'
            if any(widths.get(n) is None for n in self.dense if n != EMBEDDING):
                raise ValueError(f"the verifier features {list(self.dense)} need the batch's state")
            self._place(
                hidden.device,
                {n: int(widths[n].shape[-1]) for n in self.dense if n != EMBEDDING},
            )
        base = self._row_part(rows, reuse)
        plan = self._host_rows.get(hidden.shape)
        if plan is None:
            plan = self._host_rows[hidden.shape] = HostRows.build(self, hidden)
        if plan.table is not None:
            if tokens is None and self.support is not None:
                if self._head_table is None:
                    self._head_table = self._table.index_select(0, self.support)
                torch.index_select(self._head_table, 0, index, out=plan.table)
            else:
                torch.index_select(
                    self._table, 0, index if tokens is None else tokens, out=plan.table
                )
        if plan.hidden is not None:  # `record_half`, written in place
            torch.clamp(_float(hidden), -FLOAT16_MAX, FLOAT16_MAX, out=plan.hidden)
            plan.hidden.copy_(plan.half.copy_(plan.hidden))
        if plan.columns:
            step = HostStep(_float(q), _float(logits), index, rows.get("run"), offset, self._bounds)
            for write, out in plan.columns:
                write(step, out)
        return torch.sigmoid(torch.addmv(base, plan.x, self._host_weight))

    def _row_part(self, rows: dict[str, torch.Tensor], reuse: bool) -> torch.Tensor:
        """bias + the ROW_ONLY features' part of z: (B,), or the bias alone (0-dim). With
        `reuse`, kept while the row tensors they read are the same tensors, unwritten: the
        engine's RowState fields between two commits (a commit makes new ones)."""
        if not self.row_only:
            return self._bias
        if reuse and self._row_kept is not None and unchanged(self._row_kept, rows):
            return self._row_base
        read = self._row_fields_read
        if any(rows.get(f) is None for f in read):
            raise ValueError(f"the verifier features {list(self.row_only)} need the batch's state")
        state = RowState(**{f: rows.get(f) for f in STATE_FIELDS})
        inputs = DecodeInputs(None, state, self.embedding)  # type: ignore[arg-type]  # no step read
        base = self._bias
        for name in self.row_only:  # one op each (its product, added)
            value = FEATURES[name].at_decode(inputs, self.settings)
            if name in self.dense:
                base = torch.addmv(base, record_half(value), self._blocks[name])
            else:
                base = torch.add(base, _float(value), alpha=self._row_weights[name])
        if reuse:
            self._row_kept = tuple((f, rows[f], version_of(rows[f])) for f in read)
            self._row_base = base
        return base


def _float(values: torch.Tensor) -> torch.Tensor:
    return values if values.dtype == torch.float32 else values.float()


def record_half(block: torch.Tensor) -> torch.Tensor:
    """`as_record_half(block)` back in float32: the block rounded as records store it."""
    return _float(block).clamp(-FLOAT16_MAX, FLOAT16_MAX).half().float()


def _add_product(z: torch.Tensor | None, rows: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """z + rows @ w (rows @ w where z is None)."""
    return rows @ w if z is None else torch.addmv(z, rows, w)


@torch.inference_mode()
def token_table(embedding: torch.nn.Module, w: torch.Tensor, device: torch.device) -> torch.Tensor:
    """(V,) each vocabulary id's embedding, rounded as records store it, times `w`: the
    embedding block's part of the score, looked up by the drafted token. V is the rows of the
    module's (first) `nn.Embedding`: a factorised embedding's low-rank table has the
    vocabulary's rows too."""
    size = next(m for m in embedding.modules() if isinstance(m, torch.nn.Embedding)).num_embeddings
    home = next(embedding.parameters()).device
    table = []
    for start in range(0, size, TABLE_CHUNK):
        ids = torch.arange(start, min(start + TABLE_CHUNK, size), device=home)
        table.append(as_record_half(embedding(ids)).float().to(device) @ w)
    return torch.cat(table)
