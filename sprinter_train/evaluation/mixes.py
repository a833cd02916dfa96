"""Every predictor's AUC on each prefix mix of the records, and on all of them together.

The harvest draws each prompt's prefix from one of four mixes (harvest/mixes.py): dataset
text (`original`, SPRINTER Fig. 3's setting), the draft's, the target's, and the interleaving
speculative decoding produces (`interleaved`, what a decoder's verifier sees). A verifier
trained on all four can rank well on one and badly on another; the pooled AUC hides that.
Each mix's interval is the prompt bootstrap of its own prompts (one prompt is one mix), so
the intervals are as wide as the mix's share of the prompts makes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sprinter_train.core.classification import auc
from sprinter_train.evaluation.bootstrap import PromptBootstrap
from sprinter_train.harvest.mixes import MIXES

ALL = "all"
DECODER_MIX = "interleaved"  # the prefixes a decoder's verifier scores
PAPER_MIX = "original"  # SPRINTER Fig. 3: dataset prefixes


def mix_metrics(
    scores: Mapping[str, np.ndarray],
    y_label: np.ndarray,
    mixes: np.ndarray,
    prompt_ids: np.ndarray,
    bcfg: Mapping[str, Any],
    wanted: Sequence[str] = MIXES,
) -> dict[str, Any]:
    """{mix: {rows, prompts, auc: {predictor: value}, auc_ci: {predictor: [lo, hi]}}} for each
    wanted mix the rows hold (in `wanted`'s order) and `all` (every row); every mix draws its
    own resamples with evaluate.bootstrap's settings. Nothing when `wanted` is empty."""
    if not wanted:
        return {}
    mixes = np.asarray(mixes).astype(str)
    prompt_ids = np.asarray(prompt_ids)
    present = [str(m) for m in wanted if str(m) in set(mixes)]
    out: dict[str, Any] = {}
    for mix in [*present, ALL]:
        rows = np.ones(len(mixes), dtype=bool) if mix == ALL else mixes == mix
        boot = PromptBootstrap.from_cfg(bcfg, prompt_ids[rows])
        y = y_label[rows]
        out[mix] = {
            "rows": int(rows.sum()),
            "prompts": int(len(np.unique(prompt_ids[rows]))),
            "auc": {name: auc(y, np.asarray(s)[rows]) for name, s in scores.items()},
            "auc_ci": {
                name: boot.auc_interval(y, np.asarray(s)[rows]) for name, s in scores.items()
            },
        }
    return out


def named_rows(by_mix: Mapping[str, Any], verifiers: list[str]) -> dict[str, Any]:
    """Each verifier on the decoder's mix and on the paper's, under names that say which:
    {"<verifier> on interleaved (decoder)": {auc, auc_ci}, "<verifier> on original (Fig. 3)": ...}."""
    out: dict[str, Any] = {}
    for name in verifiers:
        for mix, role in ((DECODER_MIX, "decoder"), (PAPER_MIX, "SPRINTER Fig. 3")):
            entry = by_mix.get(mix)
            if entry is None or name not in entry["auc"]:
                continue
            out[f"{name} on {mix} ({role})"] = {
                "mix": mix,
                "auc": entry["auc"][name],
                "auc_ci": entry["auc_ci"][name],
            }
    return out
