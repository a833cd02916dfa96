"""Intervals for AUCs by resampling test prompts, not rows.

The rows of one prompt are consecutive tokens of one continuation and move together (a prompt
the verifier reads badly is read badly at every position), so treating rows as independent
would understate the spread. Each resample draws as many prompts as the split holds, with
replacement, and keeps every row of a drawn prompt as often as it was drawn; the interval is
the percentile interval of the resampled AUCs. Every predictor is scored on the same
resamples, so the difference between two predictors' AUCs gets a paired interval too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sprinter_train.core.classification import weighted_auc


@dataclass(frozen=True)
class PromptBootstrap:
    """One set of prompt resamples of one split's rows."""

    group: np.ndarray  # (rows,) each row's prompt, as an index into the sorted unique prompt ids
    counts: np.ndarray  # (resamples, prompts) how often resample b drew prompt g
    level: float
    seed: int

    @classmethod
    def draw(
        cls, prompt_ids: np.ndarray, resamples: int, seed: int, level: float = 0.95
    ) -> PromptBootstrap:
        """Resample b is row b of default_rng(seed).integers(0, G, (resamples, G)), indices
        into the G sorted unique prompt ids (the same stream as one integers(0, G, G) call
        per resample)."""
        ids, group = np.unique(np.asarray(prompt_ids), return_inverse=True)
        n = len(ids)
        counts = np.zeros((int(resamples), n), dtype=np.int64)
        if n:
            draws = np.random.default_rng(seed).integers(0, n, size=(int(resamples), n))
            flat = (draws + n * np.arange(int(resamples))[:, None]).ravel()
            counts = np.bincount(flat, minlength=int(resamples) * n).reshape(-1, n)
        return cls(group.reshape(-1), counts, float(level), int(seed))

    @classmethod
    def from_cfg(cls, bcfg: Mapping[str, Any], prompt_ids: np.ndarray) -> PromptBootstrap:
        """From evaluate.bootstrap (resamples, seed, level)."""
        return cls.draw(prompt_ids, int(bcfg["resamples"]), int(bcfg["seed"]), float(bcfg["level"]))

    @property
    def resamples(self) -> int:
        return len(self.counts)

    @property
    def prompts(self) -> int:
        return self.counts.shape[1]

    def aucs(self, y: np.ndarray, score: np.ndarray, chunk: int = 1 << 22) -> np.ndarray:
        """The AUC of every resample (NaN where a resample lacks a class); at most `chunk`
        row weights in memory at once."""
        step = max(1, chunk // max(len(self.group), 1))
        chunks = [
            weighted_auc(y, score, self.counts[i : i + step][:, self.group])
            for i in range(0, self.resamples, step)
        ]
        return np.concatenate(chunks) if chunks else np.zeros(0)

    def interval(self, values: np.ndarray) -> list[float] | None:
        """Percentile interval at `level` of the defined resampled values (None if none is)."""
        kept = np.asarray(values)[np.isfinite(values)]
        if len(kept) == 0:
            return None
        tail = 50.0 * (1.0 - self.level)
        lo, hi = np.percentile(kept, [tail, 100.0 - tail])
        return [float(lo), float(hi)]

    def auc_interval(self, y: np.ndarray, score: np.ndarray) -> list[float] | None:
        return self.interval(self.aucs(y, score))

    def describe(self) -> dict[str, Any]:
        """What report.json says about the intervals."""
        return {
            "unit": "prompt",
            "method": "percentile",
            "prompts": self.prompts,
            "resamples": self.resamples,
            "seed": self.seed,
            "level": self.level,
        }
