"""What a verifier learns to predict: SPRINTER's hard label or SpecDec++'s soft one.

`ratio` (SPRINTER §3.2): 1 if q(x)/p(x) <= λ, else 0, one verifier per λ. `accept_prob`
(SpecDec++, Huang et al. 2024): the acceptance probability min(1, p(x)/q(x)) itself, fitted
with BCE on that soft target, so sigmoid(logit) estimates E[min(1, p/q) | s], the quantity a
length policy multiplies along a draft run. It has no λ. The records hold both columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sprinter_train.core.validation import check, positive_finite, section

LABELS = ("ratio", "accept_prob")
ACCEPT_NAME = "accept"  # verifier-accept.safetensors, train/accept/, "verifier_accept"


def lam_name(lam: float) -> str:
    """1.0 -> '1', 1.2 -> '1.2': the λ in file names and report keys."""
    return f"{float(lam):g}"


def labels_at(ratio: np.ndarray, lam: float) -> np.ndarray:
    """SPRINTER §3.2: 1 if q(x)/p(x) <= λ (acceptable), else 0; ratio is +inf where p = 0."""
    return (np.asarray(ratio) <= lam).astype(np.float32)


@dataclass(frozen=True)
class Label:
    """One training target: `kind` is ratio (with its λ) or accept_prob (no λ)."""

    kind: str = "ratio"
    lam: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in LABELS:
            raise ValueError(f"train.label={self.kind!r}: choose from {list(LABELS)}")
        if self.kind == "ratio" and (
            self.lam is None or not np.isfinite(self.lam) or self.lam <= 0
        ):
            raise ValueError(f"train.label=ratio needs a finite λ > 0, got {self.lam!r}")
        if self.kind == "accept_prob" and self.lam is not None:
            raise ValueError("train.label=accept_prob has no λ (the soft label is min(1, p/q))")

    @classmethod
    def of(cls, value: Label | float) -> Label:
        """A Label as is; a bare number is the ratio label at that λ (the historical call)."""
        return value if isinstance(value, Label) else cls("ratio", float(value))

    @property
    def threshold(self) -> float:
        """The λ of a ratio label; an accept_prob label has none."""
        if self.lam is None:
            raise ValueError("train.label=accept_prob has no λ")
        return self.lam

    @property
    def column(self) -> str:
        """The records column the target is computed from."""
        return "ratio" if self.kind == "ratio" else "accept_prob"

    @property
    def name(self) -> str:
        """'lam1.2' or 'accept': the file stem's suffix, the log folder, the result key."""
        return f"lam{lam_name(self.threshold)}" if self.kind == "ratio" else ACCEPT_NAME

    def targets(self, values: np.ndarray) -> np.ndarray:
        """float32 targets from the `column` values: 0/1 at λ, or min(1, p/q) in [0, 1]."""
        if self.kind == "ratio":
            return labels_at(values, self.threshold)
        return np.clip(np.asarray(values, dtype=np.float32), 0.0, 1.0)

    def describe(self) -> str:
        """The target in words, for logs and errors."""
        return f"q/p <= {lam_name(self.threshold)}" if self.kind == "ratio" else "min(1, p/q)"


def lam_problems(cfg: Mapping[str, Any]) -> list[str]:
    """Every λ of the config outside train.lam_range (train.lam, train.lams, evaluate.lams,
    evaluate.ceiling.lam, each method's verifier.lam), one line each naming the range."""
    train = section(cfg, "train")
    bounds = train.get("lam_range")
    if bounds is None:
        return []
    low, high = float(bounds[0]), float(bounds[1])
    found: list[tuple[str, Any]] = []
    if train.get("lam") is not None:
        found.append(("train.lam", train["lam"]))
    elif isinstance(train.get("lams"), list | tuple):
        found += [(f"train.lams[{i}]", lam) for i, lam in enumerate(train["lams"])]
    evaluate = section(cfg, "evaluate")
    if isinstance(evaluate.get("lams"), list | tuple):
        found += [(f"evaluate.lams[{i}]", lam) for i, lam in enumerate(evaluate["lams"])]
    ceiling = evaluate.get("ceiling") or {}
    if ceiling.get("lam") is not None:
        found.append(("evaluate.ceiling.lam", ceiling["lam"]))
    for name, node in section(cfg, "methods").items():
        entry = node.get("verifier") if isinstance(node, dict) else None
        if entry and entry.get("label", "ratio") == "ratio" and entry.get("lam") is not None:
            found.append((f"methods.{name}.verifier.lam", entry["lam"]))
    problems: list[str] = []
    for key, lam in found:
        if key.startswith("train.") and not _positive(lam):
            continue  # its declaration names it (a finite number > 0)
        check(
            problems,
            key,
            lam,
            lambda x: low <= x <= high,
            f"train.lam_range [{low:g}, {high:g}] (the label q/p <= λ is almost all one class "
            "outside it)",
        )
    return problems


def _positive(value: Any) -> bool:
    try:
        return positive_finite(float(value))
    except (TypeError, ValueError):
        return False


def check_both_classes(targets: np.ndarray, label: Label, split: str = "train") -> None:
    """Refuse a split whose labels are all one class: the fit would learn only its bias (an
    all-negative verifier that exits 0)."""
    if len(targets) and float(np.min(targets)) == float(np.max(targets)):
        which = "positive" if float(targets[0]) >= 1 else "negative"
        raise ValueError(
            f"every {split} label of {label.describe()} is {which} ({len(targets)} rows): "
            f"λ = {label.lam} cannot be learnt from these records; choose a λ inside "
            "train.lam_range where both classes occur"
        )


def trained_lams(train: Mapping[str, Any]) -> list[float]:
    """The λs stage=train trains: train.lam if set (one job of a sweep, or a single λ asked
    of stage=all), else every λ in train.lams. Evaluate scores the same ones by default."""
    if train.get("lam") is not None:
        return [float(train["lam"])]
    return [float(lam) for lam in train.get("lams") or []]
