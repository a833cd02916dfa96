"""SV's acceptance table P(accept | S, A) (SV §4.2, App. D.8) and the lookup the decoder calls.

S = sum_v min(P_d(v), P_c(v)) and A = min(1, P_c(x)/P_d(x)) come from a companion model;
each (S, A) cell holds the mean of X = min(1, p(x)/q(x)), the target's acceptance
probability of the drafted token, over the records that fall in it. Equal-width grids cover
[0, 1]^2; the adaptive grid puts its edges at quantiles of S and of A, so cells are smaller
where records are dense. A cell with fewer than `min_count` records takes the pooled mean
of its neighbourhood (radius 1, then 2), else the global mean: a lookup never returns NaN.
Fitting (counting, filling, the information S and A carry) lives in sv/fit.py.

    table = SVTable.load("artifacts/<exp>/tables/sv_table.json")   # the default binning
    table.lookup(S, A)                                               # -> P(accept)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sprinter_train.core.io import MissingInputError, corrupt_input, json_text, read_json_input
from sprinter_train.data.overlap import Reader, reader_overlap
from sprinter_train.models.identity import roles_differences


@dataclass(frozen=True)
class Binning:
    """Cell edges over S (rows) and A (columns); outer edges are 0 and 1."""

    name: str
    s_edges: np.ndarray
    a_edges: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.s_edges) - 1, len(self.a_edges) - 1

    @classmethod
    def equal_width(cls, n: int) -> Binning:
        edges = np.linspace(0.0, 1.0, int(n) + 1)
        return cls(f"{n}x{n}", edges, edges.copy())

    @classmethod
    def adaptive(cls, S: np.ndarray, A: np.ndarray, n_s: int, n_a: int) -> Binning:
        """Edges at quantiles of the data (repeated quantiles, e.g. A's mass at 1, merge)."""
        return cls("adaptive", quantile_edges(S, n_s), quantile_edges(A, n_a))

    def cells(self, S: np.ndarray, A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(i, j) cell of each point: bin i holds s_edges[i] <= S < s_edges[i+1]."""
        n_s, n_a = self.shape
        i = np.searchsorted(self.s_edges[1:-1], np.asarray(S, dtype=np.float64), side="right")
        j = np.searchsorted(self.a_edges[1:-1], np.asarray(A, dtype=np.float64), side="right")
        return np.clip(i, 0, n_s - 1), np.clip(j, 0, n_a - 1)

    def flat(self, S: np.ndarray, A: np.ndarray) -> np.ndarray:
        i, j = self.cells(S, A)
        return i * self.shape[1] + j


def quantile_edges(values: np.ndarray, n: int) -> np.ndarray:
    """0, the distinct interior quantiles inside (0, 1], then 1."""
    values = np.asarray(values, dtype=np.float64)
    inner = np.quantile(values, np.linspace(0, 1, int(n) + 1)[1:-1]) if len(values) else []
    inner = np.unique(np.asarray(inner))
    inner = inner[(inner > 0.0) & (inner <= 1.0)]
    return np.concatenate([[0.0], inner, [1.0]])


SEAL = "content_sha256"  # sha256 of the table's JSON without this key, written by stage=tables


def content_hash(payload: dict[str, Any]) -> str:
    """sha256 of the payload's canonical JSON, its own seal left out."""
    body = {k: v for k, v in payload.items() if k != SEAL}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def sealed(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload (as its JSON reads back) with its content hash: an edit of any number is
    then refused on read."""
    plain = json.loads(json_text(payload))
    return {**plain, SEAL: content_hash(plain)}


def edges_problem(name: str, edges: np.ndarray) -> str | None:
    """S and A lie in [0, 1]: edges must rise strictly from 0 to 1 (reversed or stretched
    edges send every point to one cell, and the table still answers). The one repeat allowed
    is a last edge of 1 after an inner 1: the adaptive grid's cell of A = 1 exactly."""
    if edges.ndim != 1 or len(edges) < 2 or not bool(np.all(np.isfinite(edges))):
        return f"{name} {edges.tolist()} is not a list of at least two finite edges"
    rising = np.diff(edges[:-1] if len(edges) > 2 and edges[-2] == 1.0 else edges)
    if not bool(np.all(rising > 0)):
        return f"{name} {edges.tolist()} do not increase strictly"
    if edges[0] != 0.0 or edges[-1] != 1.0:
        return f"{name} run from {edges[0]} to {edges[-1]}, not over S's and A's range [0, 1]"
    return None


def table_problem(payload: dict[str, Any], table: SVTable) -> str | None:
    """What is wrong with a loaded table, or None: its seal, edges, P(accept) and counts."""
    if payload.get(SEAL) != content_hash(payload):
        found = "no content hash" if SEAL not in payload else "a content hash its numbers miss"
        return f"{found} (edited, or written before tables were sealed)"
    binning = table.binning
    for name, edges in (("s_edges", binning.s_edges), ("a_edges", binning.a_edges)):
        problem = edges_problem(name, edges)
        if problem:
            return problem
    p, counts = table.p_accept, table.counts
    if p.shape != binning.shape or not bool(np.all((p >= 0) & (p <= 1))):
        return f"P(accept) of shape {p.shape} for {binning.shape} cells, or outside [0, 1]"
    if counts.shape != binning.shape or not bool(np.all(counts >= 0)):
        return f"counts of shape {counts.shape} for {binning.shape} cells, or negative"
    rows = payload.get("rows")
    if rows is not None and int(counts.sum()) != int(rows):
        return f"counts summing to {int(counts.sum())}, but the table was fitted on {rows} rows"
    return None


class TableMismatchError(ValueError):
    """A table fitted on the records of other models than the run's."""


def check_table_models(
    table: SVTable, path: Path, ours: dict[str, dict[str, Any]], experiment: str
) -> None:
    """Refuse a table whose records came from another target, draft or companion than the
    run's (each differing identity field named): its cells describe other distributions."""
    problems = roles_differences(table.meta.get("models") or {}, ours)
    if problems:
        raise TableMismatchError(
            f"{path} was fitted on records of other models: {'; '.join(problems)}: run with "
            "its models, or refit it for these with `python -m sprinter_train stage=harvest "
            f"experiment={experiment}` then `python -m sprinter_train stage=tables "
            f"experiment={experiment}`"
        )


def check_fitted_table(
    table: SVTable,
    path: Path,
    reader: Reader,
    identities: dict[str, dict[str, Any]] | None,
    remedy: str,
) -> int | None:
    """The one rule every reader of an SV table applies (as check_fitted_verifier for a
    verifier): refuse a table of other models than `identities` (role -> model_identity;
    None: not known to the reader), or fitted on prompts the reader scores unless allowed;
    return how many of them it was fitted on."""
    if identities is not None:
        check_table_models(table, path, identities, str(reader.experiment))
    return reader_overlap(table.meta.get("fitted_prompts"), reader, f"the SV table {path}", remedy)


@dataclass
class SVTable:
    """A fitted table: P(accept | S, A) by cell lookup."""

    binning: Binning
    p_accept: np.ndarray
    counts: np.ndarray
    meta: dict[str, Any]

    @classmethod
    def from_json(cls, payload: dict[str, Any], binning: str | None = None) -> SVTable:
        name = binning or payload["default"]
        if name not in payload["binnings"]:
            raise KeyError(f"no binning {name!r}; the table has {', '.join(payload['binnings'])}")
        entry = payload["binnings"][name]
        edges = Binning(name, np.asarray(entry["s_edges"]), np.asarray(entry["a_edges"]))
        return cls(
            edges,
            np.asarray(entry["p_accept"], dtype=np.float64),
            np.asarray(entry["counts"]),
            payload,
        )

    @classmethod
    def load(cls, path: str | Path, binning: str | None = None) -> SVTable:
        """Load a table written by stage=tables; a missing or corrupt file names that stage."""
        path = Path(path)
        command = f"`python -m sprinter_train stage=tables experiment={path.parent.parent.name}`"
        if not path.exists():
            raise MissingInputError(f"SV table {path} does not exist: make it with {command}")
        remedy = f"rewrite it with {command}"
        payload = read_json_input(path, remedy, keys=("binnings", "default"))
        if not isinstance(payload["binnings"], dict):
            raise corrupt_input(path, "binnings is not a mapping", remedy)
        if (binning or payload["default"]) not in payload["binnings"]:
            return cls.from_json(payload, binning)  # names the binnings the table has
        try:
            table = cls.from_json(payload, binning)
        except (KeyError, TypeError, ValueError) as error:
            raise corrupt_input(path, f"{type(error).__name__}: {error}", remedy) from error
        problem = table_problem(payload, table)
        if problem:
            raise corrupt_input(path, problem, remedy)
        return table

    def lookup(self, S: float | np.ndarray, A: float | np.ndarray) -> float | np.ndarray:
        """P(accept) for the cell of (S, A); scalars in, a float out."""
        i, j = self.binning.cells(S, A)
        out = self.p_accept[i, j]
        return float(out) if np.ndim(out) == 0 else out

    def marginal_s(self) -> np.ndarray:
        """P(accept | S-row i): the row's cells averaged with their record counts (the filled
        cells' plain mean for a row without records). What is known before a token is drawn:
        S depends only on the draft's and the companion's distributions."""
        weights = self.counts.astype(np.float64)
        totals = weights.sum(1)
        weighted = (self.p_accept * weights).sum(1) / np.maximum(totals, 1.0)
        return np.where(totals > 0, weighted, self.p_accept.mean(1))

    def on(self, device: torch.device | str) -> DeviceTable:
        """The same lookups on the decoder's device, for tensors of rows."""
        weights = self.counts.astype(np.float64)
        prior = float((self.p_accept * weights).sum() / max(weights.sum(), 1.0))
        return DeviceTable(
            torch.as_tensor(self.binning.s_edges[1:-1], device=device),
            torch.as_tensor(self.binning.a_edges[1:-1], device=device),
            torch.as_tensor(self.p_accept, device=device),
            torch.as_tensor(self.marginal_s(), device=device),
            prior,
        )


class DeviceTable:
    """SVTable's lookups as tensor operations: no host round trip in the decoding loop.
    (A plain class: hydra.utils.instantiate would turn a dataclass argument into a config.)"""

    def __init__(
        self,
        s_inner: torch.Tensor,
        a_inner: torch.Tensor,
        p_accept: torch.Tensor,
        p_given_s: torch.Tensor,
        prior: float,
    ) -> None:
        self.s_inner, self.a_inner = s_inner, a_inner
        self.p_accept, self.p_given_s = p_accept, p_given_s
        self.prior = prior  # P(accept) over every record: known before any forward

    def _row(self, S: torch.Tensor) -> torch.Tensor:
        return torch.bucketize(S.to(self.s_inner.dtype), self.s_inner, right=True)

    def lookup(self, S: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
        """P(accept | S, A) per row, the same cell as SVTable.lookup."""
        column = torch.bucketize(A.to(self.a_inner.dtype), self.a_inner, right=True)
        return self.p_accept[self._row(S), column]

    def lookup_s(self, S: torch.Tensor) -> torch.Tensor:
        """P(accept | S) per row, before the token is drawn."""
        return self.p_given_s[self._row(S)]
