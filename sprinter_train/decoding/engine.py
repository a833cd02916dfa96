"""The decoding engine: a batch of rows that advance at their own pace.

Policies (policies/) decide how many tokens each row drafts and how the target checks them;
the engine gives them batched operations (draft a token in the rows still drafting, read the
companion, score every row's drafts with the target) and commits what a round emits, cutting
each row at EOS and at its budget; rows that finish leave the batch. Drafts, distributions,
acceptance and the random streams (`core.streams.RowStreams`) stay on the device: the host
learns a round's outcome in one transfer at its end and sends what the caches lack through
pinned memory without waiting (`any`: why a drafting check may run one step late on CUDA).
Each forward's time feeds the run's cost model (`timings`), which policies price rounds with.
`decoding.builder` assembles engines from the decoding settings; `decoding.loop` holds the
generation loop (a batch's rows, the commit of each round, `generate`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from sprinter_train.core.sampling import SamplingConfig, inverse_cdf, warp_probs
from sprinter_train.decoding.batch import (
    Batch,
    DraftStep,
    Round,
)
from sprinter_train.decoding.loop import RoundLoop
from sprinter_train.decoding.runner.after_warp import AfterWarp, Check, Draw, DrawScore, StepScorer
from sprinter_train.decoding.runner.runner import ForwardRequest, ModelRunner, RowOutput
from sprinter_train.decoding.timings import Timings


class Engine(RoundLoop):
    """Target, optional draft and companion, one sampling for all of them, and the cost model
    of their forwards (`timings`; without one, a `Timings` that learns from the run but has no
    priors yet: the bench sets its latency profile's). Every `pack_every` rounds
    (`decoding.pack_every`, which has no default in code: conf/config.yaml's is the one) the
    caches squeeze out the empty slots that rejected drafts and finished rows leave (the
    tokens do not depend on it). `decoding.builder.build_engine` assembles engines."""

    def __init__(
        self,
        target: ModelRunner,
        sampling: SamplingConfig,
        draft: ModelRunner | None = None,
        companion: ModelRunner | None = None,
        eos_token_id: int | None = None,
        *,
        pack_every: int,
        timings: Timings | None = None,
    ) -> None:
        self.runners = {"target": target, "draft": draft, "companion": companion}
        # the runners this engine has, by role (target, draft, companion)
        self.present_runners: dict[str, ModelRunner] = {
            r: x for r, x in self.runners.items() if x is not None
        }
        self.timings = Timings() if timings is None else timings
        self.target, self.draft, self.companion = target, draft, companion
        self.sampling = sampling
        self.eos_token_id = eos_token_id
        self.pack_every = pack_every
        self.device = target.device
        # width of the target's final hidden state (RowState.target_hidden); 0 for a model
        # that declares none (the state takes the width of its first verify forward)
        self.target_dim = int(getattr(getattr(target.model, "config", None), "hidden_size", 0) or 0)
        self._pending: tuple[torch.Tensor, torch.cuda.Event] | None = None  # see `any`
        # whether draft and companion have restricted heads over the same tokens (see
        # `companion_probs`): a property of the assembled runners, decided once
        heads = [None if r is None else r.support for r in (draft, companion)]
        self.shared_head = all(h is not None for h in heads) and torch.equal(*heads)

    # -- the operations policies use ---------------------------------------------------------

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        return warp_probs(logits, self.sampling)

    def warped(self, out: RowOutput, offset: int | None = None) -> torch.Tensor:
        """The engine's sampling over a forward's logits (at kept `offset` only, when given):
        the runner's, warped in its captured graph (a forward asked with `warp`), else warped
        here."""
        if out.probs is not None:
            return out.probs if offset is None else out.probs[:, offset]
        return self.warp(out.logits if offset is None else out.logits[:, offset])

    def runner(self, role: str) -> ModelRunner:
        runner = self.runners[role]
        if runner is None:
            raise ValueError(f"this policy needs a {role} model (models.{role} in the config)")
        return runner

    def feed(
        self,
        batch: Batch,
        role: str,
        active: torch.Tensor,
        after: torch.Tensor | None = None,
        after_counts: torch.Tensor | None = None,
        restricted: bool = False,
        warp: bool = False,
        then: AfterWarp | None = None,
    ) -> RowOutput:
        """Feed each active row what `role`'s cache lacks of its committed tokens, then
        after[r, :after_counts[r]] (drafts on the device); outputs at the fed positions that
        predict each of those drafts and the token past them: (B, A + 1, ...). `restricted`:
        see `ModelRunner.run` (`ForwardRequest`); `warp`: the caller will warp the logits
        (`warped`); `then`: and do this with them (`after_warp`: a draw or a speculative
        check)."""
        lack = self.lacking(batch, role)
        sizes = [len(x) for x in lack]
        extra = 0 if after is None else after.shape[1]
        width = max(sizes) + extra
        ids = self.send(torch.tensor([x + [0] * (width - len(x)) for x in lack], dtype=torch.long))
        # per row, built on the host in one tensor: how many tokens it lacks, the offsets to
        # keep (from its last lacking token on) and those of its drafts in the block
        plan = [[n, *range(n - 1, n + extra), *range(n, n + extra)] for n in sizes]
        plan_t = self.send(torch.tensor(plan, dtype=torch.long))
        counts, keep = plan_t[:, 0], plan_t[:, 1 : extra + 2]
        if after is not None:
            ids.scatter_(1, plan_t[:, extra + 2 :], after)
            counts = counts + after_counts
        counts = counts * active  # a row not active feeds nothing
        return self.forward(batch, role, ids, counts, keep, restricted, warp, then)

    def lacking(self, batch: Batch, role: str) -> list[list[int]]:
        """Each row's committed tokens `role`'s cache lacks, after a prompt's prefill (one row
        at a time, see ModelRunner.prime): its last token is left for the batched forward,
        which returns its logits."""
        lack = [row.tokens[held:] for row, held in zip(batch.rows, batch.held[role], strict=True)]
        if not batch.caches[role].slots and max(len(x) for x in lack) > 1:
            self.runner(role).prime(batch.caches[role], [x[:-1] for x in lack])
            lack = [x[-1:] for x in lack]
        return lack

    def forward(
        self,
        batch: Batch,
        role: str,
        ids: torch.Tensor,
        counts: torch.Tensor,
        keep: torch.Tensor,
        restricted: bool = False,
        warp: bool = False,
        then: AfterWarp | None = None,
    ) -> RowOutput:
        """One forward of `role` over the batch's rows (its call counted; its time is read from
        the runner once the generation ends); `warp`, `then`: see `feed`. The target's
        outputs are transient (`ModelRunner.run`, `ForwardRequest.transient`): it runs once a
        round (`target_probs` checks), and what reads them reads them in that round and its
        commit."""
        sampling = self.sampling if warp else None
        runner, cache = self.runner(role), batch.caches[role]
        transient = role == "target"
        request = ForwardRequest(ids, counts, keep, restricted, sampling, then, transient)
        out = runner.run(cache, request)
        setattr(batch.stats, f"{role}_calls", getattr(batch.stats, f"{role}_calls") + 1)
        return out

    def send(self, values: torch.Tensor) -> torch.Tensor:
        """A host tensor on the model's device, copied from pinned memory without waiting."""
        if self.device.type != "cuda":
            return values.to(self.device)
        return values.pin_memory().to(self.device, non_blocking=True)

    def tensor(self, values: Sequence[int]) -> torch.Tensor:
        return self.send(torch.tensor(list(values), dtype=torch.long))

    def sample(self, probs: torch.Tensor, batch: Batch, active: torch.Tensor) -> torch.Tensor:
        """(B,) one token per row from (B, V) probabilities; only active rows use a draw."""
        return inverse_cdf(probs, batch.streams.uniform(1, active)[:, 0])

    def draw(
        self,
        probs: torch.Tensor,
        out: RowOutput,
        batch: Batch,
        draw: Draw,
        active: torch.Tensor,
    ) -> torch.Tensor:
        """(B,) the token index `draw` (uniforms shown by `RowStreams.peek`, handed to the
        forward `out`) makes in `probs`, `out`'s (B, 1, V) warped distributions at its first
        offset: the index its captured graph drew, else drawn here; only active rows use
        their draw. The token `sample` gives, without its nine host ops where the graph
        drew."""
        batch.streams.advance(1, active)
        return draw.apply(probs, draw.u)[0] if out.drawn is None else out.drawn

    def draft_step(
        self,
        batch: Batch,
        rnd: Round,
        active: torch.Tensor,
        keep: Callable[[DraftStep], torch.Tensor] | None = None,
        scorer: StepScorer | None = None,
    ) -> DraftStep:
        """The draft's next distribution in the active rows (after their committed tokens and
        this round's drafts so far), and a token drawn in the rows that `keep` (decided from
        q alone, before any draw) lets draft; `scorer`: and the drawn token's score
        (`DraftStep.score`), computed with the draw.

        A restricted-head draft is warped and sampled on its K head tokens (ascending ids):
        its logits are -inf elsewhere, so warping gives q = 0 there and the inverse CDF walks
        the same nonzero masses in the same order; the drawn index is mapped to its id."""
        u = batch.streams.peek()[:, 0]
        draw: Draw | DrawScore = Draw(u)  # in the forward's graph where it has one
        if scorer is not None:
            runner = self.runner("draft")
            scorer.bind(runner.support, runner.vocab_size)
            state = () if not scorer.row_fields else batch.state.read(scorer.row_fields, rnd)
            draw = DrawScore(u, state, scorer)
        out = self.draft_side(batch, "draft", rnd, active, restricted=True, warp=True, then=draw)
        logits = out.logits[:, 0]
        probs = self.warped(out)  # (B, 1, K): the step keeps one offset
        q = probs[:, 0]
        step = DraftStep(
            torch.zeros_like(active, dtype=torch.long),
            q,
            out.hidden[:, 0],
            logits,
            active,
            out.support,
            self.runner("draft").vocab_size,
            index=rnd.calls["draft"] - 1,
        )
        if keep is not None:
            step.active = active & keep(step)
        if isinstance(draw, DrawScore):
            batch.streams.advance(1, step.active)
            if out.drawn is None:  # no graph drew and scored: the same code here
                out.drawn = draw.draw(probs)
                start = time.perf_counter()  # the verifier's own time (launches, on CUDA)
                out.score = draw.score(probs, out.logits, out.hidden, out.drawn)
                batch.stats.verifier_seconds += time.perf_counter() - start
            drawn, step.score = out.drawn, out.score
        else:
            drawn = self.draw(probs, out, batch, draw, step.active)
        step.head_tokens = drawn
        step.tokens = drawn if out.support is None else out.support[drawn]
        return step

    def companion_probs(self, batch: Batch, rnd: Round, active: torch.Tensor) -> torch.Tensor:
        """The warped companion distribution at the position of each row's next draft: (B, K)
        over the draft's head tokens when the companion's restricted head holds the same ones,
        else (B, V). SV's S and A read c only where q > 0, so the head's K values give them
        exactly, and the companion's step skips the scatter into V values and the warp over
        them, a large share of a small companion's step; `DraftStep.on_space_of` puts q on
        the same tokens."""
        shared = self.shared_head
        out = self.draft_side(batch, "companion", rnd, active, restricted=shared, warp=True)
        return self.warped(out, 0)

    def draft_side(
        self,
        batch: Batch,
        role: str,
        rnd: Round,
        active: torch.Tensor,
        restricted: bool = False,
        warp: bool = False,
        then: AfterWarp | None = None,
    ) -> RowOutput:
        """A draft-side model's k-th call of a round feeds what it lacks of the committed
        tokens (k = 0) or the round's draft k - 1, one token a row; `warp`, `then`: see
        `feed`."""
        k = rnd.calls.get(role, 0)
        rnd.calls[role] = k + 1
        if k == 0:
            return self.feed(batch, role, active, restricted=restricted, warp=warp, then=then)
        keep = torch.zeros((len(batch), 1), dtype=torch.long, device=self.device)
        tokens = rnd.steps[k - 1].tokens[:, None]
        return self.forward(batch, role, tokens, active.long(), keep, restricted, warp, then)

    def target_probs(
        self, batch: Batch, rnd: Round, active: torch.Tensor, then: AfterWarp | None = None
    ) -> torch.Tensor:
        """(B, G + 1, V) warped target distributions at each row's drafts and one past them;
        `then`: see `feed` (its results in `batch.verified`)."""
        if batch.verified is not None:  # its outputs are transient (see `forward`)
            raise RuntimeError("a round ran the target twice; its first outputs are gone")
        if not rnd.drafted:
            out = self.feed(batch, "target", active, warp=True, then=then)
        else:
            drafts = then.drafts if isinstance(then, Check) else rnd.tokens()
            out = self.feed(batch, "target", active, drafts, rnd.counts, warp=True, then=then)
        batch.verified = out  # its state at the round's last target token (commit keeps it)
        return self.warped(out)

    def any(self, flags: torch.Tensor) -> bool:
        """Whether any row still drafts. On CPU the answer is exact. On CUDA it is the answer
        of this round's previous call once that has reached pinned memory (else True): the
        host never waits for the GPU mid-round, and since drafting rows only ever stop, a
        stale True costs at most drafting steps in which no row draws."""
        if self.device.type != "cuda":
            return bool(flags.any())
        pending = self._pending
        flag = torch.empty(1, dtype=torch.bool, pin_memory=True)
        flag.copy_(flags.any().reshape(1), non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending = (flag, event)
        return pending is None or not pending[1].query() or bool(pending[0][0])
