"""What a batch of rows carries through decoding: host-side rows, device-side caches and
streams, the drafts of a round and what a round emits, and the counts the bench reports."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import torch

from sprinter_train.core.distributions import entropy, raw_entropy, top2_margin
from sprinter_train.core.streams import RowStreams
from sprinter_train.decoding.cache.rows import RowCache


@dataclass
class DecodeStats:
    """What the bench reports per method; a batched forward counts as one call."""

    target_calls: int = 0
    draft_calls: int = 0
    companion_calls: int = 0
    verifier_calls: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0  # drafted tokens the target's check kept
    verifier_accepted: int = 0  # drafted tokens committed on a verifier's word, never checked
    # per row and round (a round of B rows counts B): how long each row's draft run was against
    # what the target kept, the bench's measure of how far a length policy is from the oracle
    row_rounds: int = 0
    drafting_rounds: int = 0  # the row drafted at least one token
    full_rounds: int = 0  # the row drafted, and the target's check kept every draft
    target_seconds: float = 0.0
    draft_seconds: float = 0.0
    companion_seconds: float = 0.0
    verifier_seconds: float = 0.0
    # the part of each model's seconds spent filling empty caches with prompts (`prime`)
    target_prefill_seconds: float = 0.0
    draft_prefill_seconds: float = 0.0
    companion_prefill_seconds: float = 0.0
    compile_seconds: float = 0.0  # compiling new shapes, outside the wall time
    # work a policy is credited with for free (the oracle's look-ahead), outside the wall
    # time and the models' seconds: its calls are never counted
    unbilled_seconds: float = 0.0
    unbilled_target_seconds: float = 0.0
    unbilled_draft_seconds: float = 0.0

    def add(self, other: DecodeStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class Row:
    """One sequence on the host: its tokens and budget, and what a policy remembers of it."""

    index: int  # position in the caller's list of prompts
    tokens: list[int]
    prompt_len: int
    max_new_tokens: int
    finished: bool = False
    memory: dict[str, Any] = field(default_factory=dict)
    from_draft: list[bool] = field(default_factory=list)  # per generated token: a kept draft

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.generated)


@dataclass
class RowState:
    """What the decode-time verifier features read of each row's history, on the device
    (updated once a round by `Engine.commit`, never read back to the host).

    `run`: how many draft-made tokens end the row's committed tokens (a draft is draft-made
    when it is committed as drawn: accepted by the target's check or trusted by a verifier);
    `accepted` / `drafted`: the row's kept and proposed drafts so far.

    `target_hidden` / `target_margin`: the target's final hidden state and raw top-2 logit
    margin at the last target-verified position, exactly: the position whose output gave the
    distribution of the row's last target-made token (the round's correction or bonus y_n, at
    committed index n - 1, came from the target's state at n - 2). A draft at position t with
    run position r thus reads the target's state at t - r - 2, one round stale. Zero while
    the row's last token that is not a draft is a prompt token (the target has verified
    nothing of the row yet)."""

    run: torch.Tensor  # (B,) long
    accepted: torch.Tensor  # (B,) float32
    drafted: torch.Tensor  # (B,) float32
    target_hidden: torch.Tensor  # (B, d_target)
    target_margin: torch.Tensor  # (B,) float32

    @classmethod
    def empty(cls, rows: int, target_dim: int, device: torch.device) -> RowState:
        zeros = torch.zeros(rows, dtype=torch.float32, device=device)
        return cls(
            torch.zeros(rows, dtype=torch.long, device=device),
            zeros,
            zeros.clone(),
            torch.zeros((rows, target_dim), dtype=torch.float32, device=device),
            zeros.clone(),
        )

    def read(self, names: tuple[str, ...], rnd: Round) -> tuple[torch.Tensor, ...]:
        """The fields `names` a step's scorer reads, the run counting the round's drafts so
        far (`rnd`'s draft calls: the next step's index), as `run_position` does."""
        drafted = rnd.calls.get("draft", 0)
        return tuple(self.run + drafted if n == "run" else getattr(self, n) for n in names)

    def select(self, index: torch.Tensor) -> RowState:
        """The rows at `index` (the batch's live rows)."""
        kept = (getattr(self, f.name) for f in fields(self))
        return RowState(*(None if value is None else value[index] for value in kept))

    def after(self, emitted: Emitted, verified: Any = None) -> RowState:
        """The state once a round's `emitted` tokens are committed: the first
        accepted + verifier_accepted of them are the row's drafts as drawn, the rest (the
        target's correction or bonus) the target's; a round of drafts only extends the run.
        `verified`: the round's target forward (a RowOutput whose offset i gave emitted token
        i's distribution), or None when the target did not run."""
        made = emitted.draft_made
        only_drafts = made >= emitted.lengths
        hidden, margin = self.target_hidden, self.target_margin
        tracks_target = hidden is not None and margin is not None  # else `only` dropped them
        if tracks_target and verified is not None and verified.final is not None:
            at = (emitted.lengths - 1).clamp(0, verified.final.shape[1] - 1)[:, None, None]
            final = verified.final.gather(1, at.expand(-1, 1, verified.final.shape[-1]))[:, 0]
            logits = verified.logits.gather(1, at.expand(-1, 1, verified.logits.shape[-1]))[:, 0]
            if hidden.shape[-1] != final.shape[-1]:  # a target that declared no width
                hidden = hidden.new_zeros((len(hidden), final.shape[-1]))
            hidden = torch.where(only_drafts[:, None], hidden, final.to(hidden.dtype))
            margin = torch.where(only_drafts, margin, top2_margin(logits))
        return RowState(
            None if self.run is None else torch.where(only_drafts, self.run + emitted.lengths, 0),
            None if self.accepted is None else self.accepted + made,
            None if self.drafted is None else self.drafted + emitted.drafted,
            hidden,
            margin,
        )

    def only(self, names: frozenset[str]) -> RowState:
        """The state keeping the fields `names` alone (the others None, never updated): a
        round's bookkeeping costs the engine device ops only for what its verifier reads (the
        target's hidden state and margin are most of them)."""
        return RowState(*(getattr(self, f.name) if f.name in names else None for f in fields(self)))


@dataclass
class Batch:
    """The live rows, their random streams and one `RowCache` per model role.

    `held[role][r]` mirrors on the host how many of row r's committed tokens that cache
    holds (refreshed from the device once per round), so the next feed is built on the host.
    """

    rows: list[Row]
    streams: RowStreams
    caches: dict[str, RowCache]
    held: dict[str, list[int]]
    stats: DecodeStats = field(default_factory=DecodeStats)
    state: RowState | None = None  # see RowState; Engine.new_batch sets it
    verified: Any = None  # the round's latest target forward (a RowOutput), for `state`

    def __len__(self) -> int:
        return len(self.rows)

    def room(self, limit: int) -> list[int]:
        """At most `limit` drafts a row, leaving room for the target's token in its budget."""
        return [max(0, min(limit, row.remaining - 1)) for row in self.rows]


def spread(
    values: torch.Tensor, support: torch.Tensor, vocab_size: int, fill: float
) -> torch.Tensor:
    """(..., K) values at the vocabulary ids `support` as (..., V), `fill` elsewhere."""
    out = values.new_full((*values.shape[:-1], vocab_size), fill)
    return out.index_copy_(-1, support, values)


@dataclass
class DraftStep:
    """One drafting step over the batch; rows not in `active` drew nothing.

    A restricted-head draft hands over its distribution and logits on its K head tokens only
    (`support`: their ascending vocabulary ids). `q` and `logits` spread them over the
    vocabulary when first read (q 0 and logits -inf off the head, which is what they are
    there), so a step no rule reads never pays for V values; speculative sampling reads q
    once per round, for all steps at once (`Round.q`).
    """

    tokens: torch.Tensor  # (B,) drafted token per row
    head_q: torch.Tensor  # (B, K) warped draft distribution the token was drawn from
    hidden: torch.Tensor  # (B, d) draft hidden state that produced q
    head_logits: torch.Tensor  # (B, K) the draft's raw logits (entropy rules read them)
    active: torch.Tensor  # (B,) bool
    support: torch.Tensor | None = None  # (K,) vocabulary ids; None: K is the vocabulary
    vocab_size: int = 0  # V, where `support` is set
    head_tokens: torch.Tensor | None = None  # (B,) each drawn token's index into head_q
    index: int = 0  # k: the round's k-th drafting step (0-based)
    score: torch.Tensor | None = None  # (B,) the drawn token's score, where a scorer drew it
    _full: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def q(self) -> torch.Tensor:
        """(B, V) the warped draft distribution."""
        return self._spread("q", self.head_q, 0.0)

    @property
    def logits(self) -> torch.Tensor:
        """(B, V) the draft's raw logits."""
        return self._spread("logits", self.head_logits, float("-inf"))

    def _spread(self, name: str, values: torch.Tensor, fill: float) -> torch.Tensor:
        if self.support is None or values is None:
            return values
        if name not in self._full:
            self._full[name] = spread(values, self.support, self.vocab_size, fill)
        return self._full[name]

    def on_space_of(self, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q and the drawn tokens over the index space of `probs`, a distribution another
        model gave at this position: the head's K tokens when `probs` has K values (the
        engine hands over a companion on the draft's head only when both heads hold the same
        tokens), else the vocabulary."""
        if probs.shape[-1] == self.head_q.shape[-1]:
            drawn = self.tokens if self.head_tokens is None else self.head_tokens
            return self.head_q, drawn
        return self.q, self.tokens

    def entropy(self, warped: bool = False) -> torch.Tensor:
        """(B,) H(q) in nats, of the warped q or of the draft's own softmax (temperature 1);
        on the head's tokens, since every other token has probability 0.

        At low temperature with top-p the warped q is one-hot at most positions (H = 0), so an
        entropy rule on it would never stop drafting; SVIP and AdaEDL default to the raw one.
        """
        return entropy(self.head_q) if warped else raw_entropy(self.head_logits)


@dataclass
class Round:
    """The drafts of one round: step j holds every row's j-th draft where `counts` > j.

    A round drafted in one captured graph (`draft_graph`) keeps no steps, only what the
    verify reads: `drafts` (B, G) and their laws `probs` (B, G, V), stacked in the graph."""

    steps: list[DraftStep] = field(default_factory=list)
    counts: torch.Tensor | None = None  # (B,) drafts kept per row
    calls: dict[str, int] = field(default_factory=dict)  # draft-side calls per role so far
    drafts: torch.Tensor | None = None
    probs: torch.Tensor | None = None

    @property
    def drafted(self) -> bool:
        """Whether any drafting step ran (else the target's own round)."""
        return bool(self.steps) or self.drafts is not None

    def tokens(self) -> torch.Tensor:
        """(B, G) drafted tokens (entries past a row's count are not its drafts)."""
        if self.drafts is not None:
            return self.drafts
        return torch.stack([s.tokens for s in self.steps], 1)

    def q(self) -> torch.Tensor:
        """(B, G, V): steps on one restricted head are stacked on it and spread once."""
        if self.probs is not None:
            return self.probs
        support = self.steps[0].support if self.steps else None
        if support is not None and all(s.support is support for s in self.steps):
            heads = torch.stack([s.head_q for s in self.steps], 1)
            return spread(heads, support, self.steps[0].vocab_size, 0.0)
        return torch.stack([s.q for s in self.steps], 1)


@dataclass
class Emitted:
    """What a round commits: tokens[r, :lengths[r]], of which the first `kept[r]` are drafts
    the caches were fed in this order (so every cache stays valid up to them), and per-row
    counts for the stats."""

    tokens: torch.Tensor  # (B, W)
    lengths: torch.Tensor  # (B,)
    kept: torch.Tensor  # (B,)
    drafted: torch.Tensor  # (B,)
    accepted: torch.Tensor  # (B,) drafts the target's check kept
    verifier_accepted: torch.Tensor | None = None  # (B,) drafts kept on a verifier's word

    COUNTS = ("drafted", "accepted", "verifier_accepted")

    @property
    def draft_made(self) -> torch.Tensor:
        """(B,) how many of the emitted tokens are drafts committed as drawn (they lead)."""
        if self.verifier_accepted is None:
            return self.accepted
        return self.accepted + self.verifier_accepted


class Policy(Protocol):
    name: str

    def round(self, engine: Any, batch: Batch) -> Emitted:
        """Draft, verify and say what each row emits (nothing read back to the host but,
        for adaptive lengths, whether any row still drafts)."""
        ...

    def update(self, row: Row, drafted: int, accepted: int) -> None:
        """Per-row memory after the round's outcome reached the host (HF's schedule)."""
        ...


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids, without the prompt
    wall_s: float  # the whole batch's wall time
    stats: DecodeStats  # the whole batch's counts
    from_draft: list[bool] = field(default_factory=list)  # per token: a draft kept as drawn
