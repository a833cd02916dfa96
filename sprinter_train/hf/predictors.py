"""The trained predictors as the exported methods read them: SPRINTER's verifier, SV's
acceptance table and the latency profile, each built from the bytes of the file stage=train,
stage=tables or stage=bench wrote (so an export folder and the embedded copy in its
custom_generate/ load the same way).

Copies of what the engine uses (sprinter_train/verifier/scorer.py and features.py's
`assemble`, sv/table.py's DeviceTable, bench/latency.py's `piecewise_linear`): this package
imports nothing from sprinter_train. tests/test_hf_export.py checks they agree.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from safetensors.torch import load as load_safetensors

FEATURE_ORDER = ("hidden", "token_embedding", "q", "draft_entropy")
DENSE = ("hidden", "token_embedding")  # rounded to float16, as records store them
FLOAT16_MAX = float(np.finfo(np.float16).max)


class Verifier:
    """SPRINTER's verifier: calibrated P(accept) = sigmoid((w·s + b) / T) of features s
    assembled as training assembled them (dense blocks rounded to float16, then scalars)."""

    def __init__(self, weights: bytes, sidecar: dict[str, Any]) -> None:
        tensors = load_safetensors(weights)
        names = list((sidecar.get("features") or {}).get("names") or [])
        unknown = sorted(set(names) - set(FEATURE_ORDER))
        if unknown or not names:
            raise ValueError(
                f"this verifier reads features {names}; the exported methods build "
                f"{', '.join(FEATURE_ORDER)}"
            )
        self.names = tuple(n for n in FEATURE_ORDER if n in names)
        self.weight = tensors["weight"].float()[0]
        self.bias = float(tensors["bias"].float()[0])
        self.temperature = float((sidecar.get("calibration") or {}).get("temperature", 1.0))
        self.hidden_layer = int(sidecar.get("hidden_layer", -1))
        self.label = str(sidecar.get("label", "ratio"))
        self.prior = train_base_rate(sidecar, self.label)
        self.meta = sidecar

    @property
    def before_the_draw(self) -> bool:
        """Whether every feature is fixed before the drafted token is drawn (the hidden state
        that produced q, and H(q)): such a score may decide whether to draw the token."""
        return set(self.names) <= {"hidden", "draft_entropy"}

    def features(
        self,
        hidden: torch.Tensor,
        q: torch.Tensor,
        token: int | None = None,
        embedding: torch.nn.Module | None = None,
    ) -> torch.Tensor:
        """(1, F) float32 features of one drafted token: `hidden` (d,) produced q (V,)."""
        parts: dict[str, torch.Tensor] = {"hidden": hidden[None]}
        if "q" in self.names or "token_embedding" in self.names:
            if token is None or embedding is None:
                raise ValueError(f"features {self.names} need the drawn token and the embedding")
            where = next(embedding.parameters()).device
            parts["token_embedding"] = embedding(torch.tensor([token], device=where))
            parts["q"] = q[token][None].float()
        if "draft_entropy" in self.names:
            parts["draft_entropy"] = _entropy(q.float())[None]
        dense = [_half(parts[n]).float().to(q.device) for n in self.names if n in DENSE]
        scalars = [parts[n].to(torch.float32)[:, None] for n in self.names if n not in DENSE]
        rows = torch.cat(dense + scalars, dim=1)
        if rows.shape[1] != self.weight.numel():
            raise ValueError(
                f"the verifier expects {self.weight.numel()} features, the draft gives "
                f"{rows.shape[1]}: was it trained on this draft?"
            )
        return rows

    def score(self, rows: torch.Tensor) -> torch.Tensor:
        """(n,) calibrated probabilities of feature rows."""
        weight = self.weight.to(rows.device)
        return torch.sigmoid((rows @ weight + self.bias) / self.temperature)


def train_base_rate(sidecar: dict[str, Any], label: str) -> float | None:
    """The train split's mean label (sidecar `class_balance`; None without it): the mean
    P(accept) a calibrated score has, what a round expects of a draft before any forward."""
    key = "mean_accept_prob" if label == "accept_prob" else "positive_fraction"
    value = ((sidecar.get("class_balance") or {}).get("train") or {}).get(key)
    return None if value is None else float(value)


def _half(block: torch.Tensor) -> torch.Tensor:
    return block.float().clamp(-FLOAT16_MAX, FLOAT16_MAX).to(torch.float16)


def _entropy(probs: torch.Tensor) -> torch.Tensor:
    logs = torch.where(probs > 0, probs.log(), torch.zeros_like(probs))
    return -(probs * logs).sum(-1)


class Table:
    """SV's P(accept | S, A) of one binning, and P(accept | S) (the cells of S's row weighted
    by their record counts), looked up as the engine's DeviceTable does."""

    def __init__(self, payload: dict[str, Any], binning: str | None = None) -> None:
        name = binning or payload["default"]
        if name not in payload["binnings"]:
            raise KeyError(f"no binning {name!r}; the table has {', '.join(payload['binnings'])}")
        entry = payload["binnings"][name]
        self.binning = name
        s_edges = np.asarray(entry["s_edges"])
        a_edges = np.asarray(entry["a_edges"])
        p_accept = np.asarray(entry["p_accept"], dtype=np.float64)
        counts = np.asarray(entry["counts"])
        weights = counts.astype(np.float64)
        totals = weights.sum(1)
        weighted = (p_accept * weights).sum(1) / np.maximum(totals, 1.0)
        given_s = np.where(totals > 0, weighted, p_accept.mean(1))
        self.prior = float((p_accept * weights).sum() / max(weights.sum(), 1.0))
        self.s_inner = torch.as_tensor(s_edges[1:-1])
        self.a_inner = torch.as_tensor(a_edges[1:-1])
        self.p_accept = torch.as_tensor(p_accept)
        self.p_given_s = torch.as_tensor(given_s)

    def _row(self, S: torch.Tensor) -> torch.Tensor:
        return torch.bucketize(S.cpu().to(self.s_inner.dtype), self.s_inner, right=True)

    def lookup(self, S: torch.Tensor, A: torch.Tensor) -> float:
        """P(accept | S, A) of one drafted token."""
        column = torch.bucketize(A.cpu().to(self.a_inner.dtype), self.a_inner, right=True)
        return float(self.p_accept[self._row(S), column])

    def lookup_s(self, S: torch.Tensor) -> float:
        """P(accept | S), known before the token is drawn."""
        return float(self.p_given_s[self._row(S)])


def companion_features(
    q: torch.Tensor, c: torch.Tensor, x: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """SV's S = sum_v min(q, c) and A = min(1, c(x)/q(x)) of one drafted token x."""
    S = torch.minimum(q, c).sum(-1)
    q_x, c_x = q[x], c[x]
    A = torch.where(q_x > 0, (c_x / q_x.clamp(min=1e-30)).clamp(max=1.0), 0.0)
    return S, A


def piecewise_linear(points: dict[int, float], x: float) -> float:
    """The value at x of the line through `points`: interpolated between two keys, the first
    value below the first key, the last segment's slope (floored at 0) past the last key."""
    keys = sorted(points)
    if x in points:
        return points[x]
    if x <= keys[0]:
        return points[keys[0]]
    for lo, hi in zip(keys, keys[1:], strict=False):
        if x < hi:
            return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)
    if len(keys) == 1:
        return points[keys[0]]
    lo, hi = keys[-2], keys[-1]
    slope = max(0.0, (points[hi] - points[lo]) / (hi - lo))
    return points[hi] + slope * (x - hi)


class Latency:
    """The batch-1 part of a latency profile (bench/latency.json): the target's forward over
    n new tokens and one drafting step. Planned with as measured (the bench's RunningLatency,
    which corrects it by the run's own forwards, is not copied: an export plans alike on every
    call)."""

    def __init__(self, profile: dict[str, Any]) -> None:
        self.target_ms = {int(k): float(v) for k, v in profile["target_ms"].items()}
        self.draft_ms = float(profile["draft_ms"])
        companion = profile.get("companion_ms")
        self.companion_ms = None if companion is None else float(companion)
        self.device = str(profile.get("device"))
        self.dtype = str(profile.get("dtype"))

    def target_s(self, new_tokens: int) -> float:
        """Seconds of a target forward over `new_tokens` (extrapolated past the top)."""
        return piecewise_linear(self.target_ms, new_tokens) / 1e3

    def step_s(self, companion: bool) -> float:
        """Seconds of one drafting step: the draft's forward, plus the companion's if the
        method reads one."""
        extra = (self.companion_ms or 0.0) if companion else 0.0
        return (self.draft_ms + extra) / 1e3
