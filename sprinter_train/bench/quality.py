"""Output-quality metrics: ROUGE-L against a reference and the target model's own perplexity.

Speculative decoding with approximate acceptance (SPRINTER, MTAD) can change the output, so the
benchmark reports how far it drifts: lexical overlap with the exact-decoding reference (ROUGE-L)
and how likely the large model finds the text it is credited with (perplexity).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

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
