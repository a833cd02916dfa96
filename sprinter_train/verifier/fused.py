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

EMBEDDING = "token_embedding"
TABLE_CHUNK = 4096  # vocabulary ids embedded at once while the table is built


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

    def bind(self, support: torch.Tensor | None, vocab_size: int) -> None:
        """The draft head's tokens (a restricted head's ids; None: the vocabulary), which
        `apply`'s drawn head indices map to."""
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
        given in `row_fields` order (the run already counting the round's earlier drafts)."""
        drawn = inverse_cdf(probs[:, 0], u)
        return drawn, self.score_drawn(probs, logits, hidden, drawn, *state)

    def score_drawn(
        self,
        probs: torch.Tensor,
        logits: torch.Tensor,
        hidden: torch.Tensor,
        drawn: torch.Tensor,
        *state: torch.Tensor,
    ) -> torch.Tensor:
        """(rows,) the score of the head index `drawn` a row (see `apply`)."""
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
