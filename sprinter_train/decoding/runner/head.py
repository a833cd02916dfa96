"""The tail every layout's forward shares after the body, written once (`tail`: the outputs
at the kept offsets, `pick`, then the head, `Head`; then the broken-logits watch,
`BrokenWatch`), so the dynamic, lean, static and captured backends cannot drift apart.
"""

from __future__ import annotations

import torch

from sprinter_train.core.broken_logits import broken_rows
from sprinter_train.models.body import head_logits
from sprinter_train.models.lean import LeanDraft

NO_POSITION = 2**62  # the watch's "no broken logits seen"


class Head:
    """The model's output head: float32 logits on the shared vocabulary, or, restricted, over
    a restricted head's K tokens only (`support`, ascending), without the scatter to the full
    vocabulary a draft step does not need."""

    def __init__(self, model: torch.nn.Module, vocab_size: int, lean: LeanDraft | None) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.lean = lean
        self.support: torch.Tensor | None = None  # the head's ids on the shared vocabulary
        self._order: torch.Tensor | None = None  # the restricted head's rows, ascending
        self._size = 0
        ids = None
        if lean is not None:
            ids = lean.head_ids
        elif hasattr(model.get_output_embeddings(), "token_ids"):
            ids = model.get_output_embeddings().token_ids
            self._order = ids.argsort()
            ids = ids[self._order]
        if ids is not None:
            self._size = int((ids < vocab_size).sum())  # ascending: a prefix
            self.support = ids[: self._size].to(next(model.parameters()).device)

    def full(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits on the shared vocabulary, whatever the head."""
        return head_logits(self.model, hidden, self.vocab_size).float()

    def logits(
        self, hidden: torch.Tensor, restricted: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits, support): over the head's own tokens when `restricted` and the head is a
        restricted one (`support` set), else on the shared vocabulary (`support` None)."""
        if not restricted or self.support is None:
            return self.full(hidden), None
        if self.lean is not None:
            logits = self.lean.head_logits(hidden)
        else:
            logits = torch.nn.functional.linear(hidden, self.model.get_output_embeddings().weight)
            if self._order is not None:
                logits = logits[..., self._order]
        return logits[..., : self._size].float(), self.support


def pick(
    final: torch.Tensor, chosen: torch.Tensor, keep: torch.Tensor, width: int, same: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The final and chosen hidden states of a block at offsets keep[r, k] (clamped into the
    block: a row's unused entries may point anywhere); `same`: the chosen states are the
    final ones (hidden layer -1), picked once and returned as both."""
    index = keep.clamp(0, width - 1)[..., None]
    picked = final.gather(1, index.expand(-1, -1, final.shape[-1]))
    if same:
        return picked, picked
    return picked, chosen.gather(1, index.expand(-1, -1, chosen.shape[-1]))


def tail(
    head: Head,
    final: torch.Tensor,
    chosen: torch.Tensor,
    keep: torch.Tensor,
    restricted: bool,
    hidden_layer: int,
    one_token: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(logits, hidden, picked, support) of a block's final and chosen hidden states: the
    states at the kept offsets (`pick`; hidden layer -1 picks once), then the head over them
    (`Head.logits`: restricted where asked and the head is). `one_token`: a one-token block
    keeping one offset is its own pick, the states taken as they are (the lean draft's
    steps, whose outputs are fresh tensors; a graph's or `reduce-overhead`'s outputs are
    overwritten by the next replay, so those layouts always pick a copy)."""
    width = final.shape[1]
    if one_token and width == 1 and keep.shape[1] == 1:  # keep is clamped to the only offset
        picked, hidden = final, chosen
    else:
        picked, hidden = pick(final, chosen, keep, width, hidden_layer == -1)
    logits, support = head.logits(picked, restricted)
    return logits, hidden, picked, support


def broken_first(
    logits: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor, counts: torch.Tensor
) -> torch.Tensor:
    """() on the device: the lowest fed position whose logits are broken, or NO_POSITION (the
    offsets past a row's fed tokens are padding and not checked)."""
    fed = (keep >= 0) & (keep < counts[:, None])
    if positions.shape[1] == 1:  # a one-token block: every kept offset clamps to it
        at = positions
    else:
        at = positions.gather(1, keep.clamp(0, positions.shape[1] - 1))
    return torch.where(broken_rows(logits) & fed, at, NO_POSITION).amin()


class BrokenWatch:
    """The lowest position whose logits were broken (NaN, +inf, no finite value), folded on
    the device so that no forward waits for it; the engine reads it once a round.

    A captured graph folds into `in_graphs` instead (a device scalar at a static address,
    made by `arm`), and marks `replayed` so the next read takes it."""

    def __init__(self, device: torch.device) -> None:
        self.none_broken = torch.tensor(NO_POSITION, device=device)
        self.in_graphs: torch.Tensor | None = None
        self.replayed = False  # whether a graph may have folded since the last read
        self._seen: torch.Tensor | None = None

    def arm(self) -> torch.Tensor:
        """The scalar captured graphs fold into (made once)."""
        if self.in_graphs is None:
            with torch.inference_mode():
                self.in_graphs = self.none_broken.clone()
        return self.in_graphs

    def see(
        self,
        logits: torch.Tensor,
        positions: torch.Tensor,
        keep: torch.Tensor,
        counts: torch.Tensor,
    ) -> None:
        """Fold a forward's lowest broken fed position (`broken_first`) into the watch."""
        if logits.numel() == 0:
            return
        first = broken_first(logits, positions, keep, counts)
        seen = self._seen
        self._seen = first if seen is None else torch.minimum(seen, first)

    def fold(
        self,
        logits: torch.Tensor,
        positions: torch.Tensor,
        keep: torch.Tensor,
        counts: torch.Tensor,
    ) -> None:
        """`see` inside a captured graph: folds into `in_graphs` in place (`arm` first)."""
        assert self.in_graphs is not None
        first = broken_first(logits, positions, keep, counts)
        torch.minimum(self.in_graphs, first, out=self.in_graphs)

    def take(self) -> torch.Tensor:
        """() on the device: the lowest broken position since the last call, or NO_POSITION;
        resets."""
        found, self._seen = self._seen, None
        if self.in_graphs is not None and self.replayed:
            self.replayed = False
            with torch.inference_mode():
                in_graphs = self.in_graphs.clone()
                self.in_graphs.fill_(NO_POSITION)
            found = in_graphs if found is None else torch.minimum(found, in_graphs)
        return self.none_broken if found is None else found
