"""Output-quality metrics: ROUGE-L against a reference and the target model's own perplexity.

Speculative decoding with approximate acceptance (SPRINTER, MTAD) can change the output, so the
benchmark reports how far it drifts: lexical overlap with the exact-decoding reference (ROUGE-L)
and how likely the large model finds the text it is credited with (perplexity).
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Iterable, Sequence

import torch
from torch import nn

_TOKEN = re.compile(r"\w+")


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence: O(len(a)*len(b)) time, O(min) memory.

    Only the previous DP row is kept, over the shorter sequence, since ROUGE-L needs the length
    and not the subsequence itself.
    """
    if len(b) > len(a):
        a, b = b, a
    previous = [0] * (len(b) + 1)
    for item in a:
        current = [0] * (len(b) + 1)
        for j, other in enumerate(b, start=1):
            if item == other:
                current[j] = previous[j - 1] + 1
            else:
                current[j] = max(previous[j], current[j - 1])
        previous = current
    return previous[-1]


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens, like rouge-score's default tokenizer without stemming.

    rouge-score keeps only [a-z0-9]; `\\w` also keeps underscores and non-ASCII letters, so
    text in other scripts is not scored as empty.
    """
    return _TOKEN.findall(text.lower())


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 (beta = 1, i.e. 2PR/(P+R)) on a 0-1 scale. Two sides with the same word
    tokens score 1.0 even when neither has any (two empty or punctuation-only outputs are the
    same output: a tiny model's text often has no word at all, and scoring it 0 against
    itself read as drift); a side without word tokens against one with some scores 0.0.

    The 0-1 scale is deliberate: the caller multiplies by 100 when it reports points.
    """
    cand, ref = tokenize(candidate), tokenize(reference)
    if not cand or not ref:
        same = cand == ref and candidate.split() == reference.split()
        return 1.0 if same else 0.0
    common = lcs_length(cand, ref)
    if common == 0:
        return 0.0
    precision, recall = common / len(cand), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def target_perplexity(model: nn.Module, context_ids: list[int], output_ids: list[int]) -> float:
    """exp(mean NLL) of `output_ids` given `context_ids` under a causal LM; nan for empty output.

    Uses the raw logits (no temperature or top-p warping): as in MTAD, the metric is the large
    model's own likelihood of the text, not that of the sampling distribution. One forward over
    context + output; logits are cast to float32 so bfloat16 models give comparable numbers.
    """
    if not output_ids:
        return float("nan")
    device = next(model.parameters()).device
    ids = torch.tensor([list(context_ids) + list(output_ids)], dtype=torch.long, device=device)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0]
    start = len(context_ids)
    if start == 0:
        # The first output token has no prefix to condition on; it is not scored.
        if len(output_ids) == 1:
            return float("nan")
        start = 1
    predicting = logits[start - 1 : ids.shape[1] - 1].float()
    targets = ids[0, start:]
    log_probs = torch.log_softmax(predicting, dim=-1)
    nll = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return math.exp(nll.mean().item())


def scored_mean(values: Iterable[float]) -> float:
    """The mean of the figures that exist: an empty output's NaN (nothing scored) is not a
    figure; NaN when none is."""
    kept = [v for v in values if v == v]
    return sum(kept) / len(kept) if kept else float("nan")


def target_perplexities(
    model: nn.Module, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int = 8
) -> list[float]:
    """`target_perplexity` of each (context, output) pair, `batch_size` pairs a forward: the
    bench scores every method's every output, one forward each was most of its quality time.

    Pairs of similar length share a forward, left-padded under an attention mask with their
    own position ids, and the target's logits are kept only at the output positions (where
    its forward takes `logits_to_keep`), so a forward holds batch x output x vocabulary
    logits rather than batch x sequence x vocabulary."""
    device = next(model.parameters()).device
    keeps = "logits_to_keep" in inspect.signature(model.forward).parameters
    scored = [len(out) - (0 if ctx else 1) for ctx, out in pairs]  # no prefix: first unscored
    out_ppl = [float("nan")] * len(pairs)
    order = sorted(
        (i for i, n in enumerate(scored) if n > 0),
        key=lambda i: len(pairs[i][0]) + len(pairs[i][1]),
    )
    for start in range(0, len(order), max(1, int(batch_size))):
        chunk = order[start : start + max(1, int(batch_size))]
        seqs = [list(pairs[i][0]) + list(pairs[i][1]) for i in chunk]
        width = max(len(s) for s in seqs)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for r, seq in enumerate(seqs):
            ids[r, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[r, width - len(seq) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        keep = max(scored[i] for i in chunk) + 1  # the logits predicting the outputs, and one
        extra = {"logits_to_keep": keep} if keeps else {}
        with torch.inference_mode():
            logits = model(
                input_ids=ids, attention_mask=mask, position_ids=positions, **extra
            ).logits[:, -keep:]
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        for r, i in enumerate(chunk):
            n = scored[i]
            predicting = log_probs[r, keep - 1 - n : keep - 1]
            nll = -predicting.gather(-1, ids[r, width - n :, None])[:, 0]
            out_ppl[i] = math.exp(nll.mean().item())
    return out_ppl
