"""Fitting SV's tables on records: cell counts, the filled P(accept) and what (S, A) tell.

Every binning (the equal-width grids and the adaptive one of tables.*) is fitted on the rows
of the fit splits. A cell holds the mean of X = min(1, p/q) over its records (SV App. D.8); a
cell with fewer than `min_count` records takes the pooled mean of its (2r+1)^2 neighbourhood
(r = 1 up to MAX_RADIUS), else the global mean. Entropies measure how much the cells tell
about three versions of acceptance (see acceptance_codes); stage=tables writes the result.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from sprinter_train.core.rules import sampled_acceptance
from sprinter_train.harvest.reader import RecordSet
from sprinter_train.sv.information import discretise, information
from sprinter_train.sv.table import Binning

MAX_RADIUS = 2
COLUMNS = ["split", "S", "A", "accept_prob", "ratio"]  # the record columns a fit reads


def require_companion(records: RecordSet, stage: str) -> None:
    """S and A exist only in records harvested with a companion: say how to get them."""
    if not records.has_companion:
        raise ValueError(
            f"{stage} needs SV's S and A, which need a companion model, but the records of "
            f"{records.records_dir} were harvested without one (models.companion null). "
            "Harvest again with a companion: the offline default's is "
            "checkpoints/drafts/smollm2-companion (`python -m sprinter_train stage=distill "
            "distill=companion`), or set models.companion.path"
        )


def fill_sparse(
    counts: np.ndarray, sums: np.ndarray, min_count: int, global_mean: float
) -> tuple[np.ndarray, np.ndarray]:
    """P(accept) per cell and where it came from: 'bin', 'radius1', 'radius2' or 'global'."""
    n_s, n_a = counts.shape
    value = np.full(counts.shape, global_mean, dtype=np.float64)
    source = np.full(counts.shape, "global", dtype=object)
    for i in range(n_s):
        for j in range(n_a):
            for radius in range(MAX_RADIUS + 1):
                window = (
                    slice(max(i - radius, 0), i + radius + 1),
                    slice(max(j - radius, 0), j + radius + 1),
                )
                pooled = counts[window].sum()
                if pooled >= max(min_count, 1):
                    value[i, j] = sums[window].sum() / pooled
                    source[i, j] = "bin" if radius == 0 else f"radius{radius}"
                    break
    return value, source


def fit_binning(
    binning: Binning, S: np.ndarray, A: np.ndarray, x: np.ndarray, min_count: int
) -> dict[str, Any]:
    """Counts, raw cell means (None where empty) and the filled P(accept) table."""
    n_s, n_a = binning.shape
    flat = binning.flat(S, A)
    counts = np.bincount(flat, minlength=n_s * n_a).reshape(n_s, n_a)
    sums = np.bincount(flat, weights=x, minlength=n_s * n_a).reshape(n_s, n_a)
    global_mean = float(np.mean(x)) if len(x) else 0.0
    value, source = fill_sparse(counts, sums, min_count, global_mean)
    raw = [
        [None if c == 0 else float(s / c) for c, s in zip(cr, sr, strict=True)]
        for cr, sr in zip(counts, sums, strict=True)
    ]
    return {
        "s_edges": binning.s_edges.tolist(),
        "a_edges": binning.a_edges.tolist(),
        "shape": [n_s, n_a],
        "cells": n_s * n_a,
        "occupied": int((counts > 0).sum()),
        "counts": counts.tolist(),
        "mean_accept_raw": raw,
        "p_accept": value.tolist(),
        "source": source.tolist(),
        "filled_cells": int((source != "bin").sum()),
    }


def acceptance_codes(frame: pd.DataFrame, x_bins: int, seed: int) -> dict[str, np.ndarray]:
    """The three versions of X whose uncertainty S and A should reduce.

    X: min(1, p/q) in `x_bins` equal-width bins of [0, 1] (the last closed at 1, so the mass
    at X = 1, q <= p, shares the top bin); binary_sampled: speculative sampling's accept event
    u < min(1, p/q) (seeded); binary_label: SPRINTER's label q/p <= 1.
    """
    x = frame["accept_prob"].to_numpy(dtype=np.float64)
    return {
        "X": discretise(x, x_bins),
        "binary_sampled": sampled_acceptance(x, seed).astype(np.int64),
        "binary_label": (frame["ratio"].to_numpy() <= 1.0).astype(np.int64),
    }


def entropies(binning: Binning, frame: pd.DataFrame, x_bins: int, seed: int) -> dict[str, Any]:
    """H, H given the cell, and I in bits of each version of X over `binning`'s cells."""
    cells = binning.flat(frame["S"].to_numpy(), frame["A"].to_numpy())
    return {
        name: information(codes, cells)
        for name, codes in acceptance_codes(frame, x_bins, seed).items()
    }


def build_tables(frame: pd.DataFrame, tcfg: dict[str, Any]) -> dict[str, Any]:
    """Every binning fitted on `frame`: cells, P(accept), entropies in bits."""
    S = frame["S"].to_numpy(dtype=np.float64)
    A = frame["A"].to_numpy(dtype=np.float64)
    x = frame["accept_prob"].to_numpy(dtype=np.float64)
    binnings = [Binning.equal_width(int(n)) for n in tcfg["grids"]]
    n_s, n_a = (int(v) for v in tcfg["adaptive"])
    binnings.append(Binning.adaptive(S, A, n_s, n_a))
    out = {}
    for binning in binnings:
        entry = fit_binning(binning, S, A, x, int(tcfg["min_count"]))
        entry["entropy_bits"] = entropies(binning, frame, int(tcfg["x_bins"]), int(tcfg["seed"]))
        out[binning.name] = entry
    return out


def fit_tables(frame: pd.DataFrame, tcfg: dict[str, Any]) -> dict[str, Any]:
    """The fitted sections of sv_table.json, from every record of tables.fit_splits in `frame`:
    the binnings, their information gain and what the numbers mean."""
    fit = frame[frame["split"].isin(tcfg["fit_splits"])]
    if len(fit) == 0:
        raise ValueError(f"stage=tables: no records in splits {tcfg['fit_splits']}")
    binnings = build_tables(fit, tcfg)
    if tcfg["default"] not in binnings:
        raise ValueError(f"tables.default={tcfg['default']!r} is none of {list(binnings)}")
    return {
        "fit_splits": list(tcfg["fit_splits"]),
        "rows": len(fit),
        "global_mean_accept": float(fit["accept_prob"].mean()),
        "default": tcfg["default"],
        "x_definition": (
            f"X = min(1, p/q) in {tcfg['x_bins']} equal-width bins of [0, 1], the last closed "
            "at 1; binary_sampled: u < min(1, p/q), u ~ U(0,1) seeded with tables.seed; "
            "binary_label: q/p <= 1"
        ),
        "value": "p_accept = mean of min(1, p/q) over the cell's records (SV App. D.8)",
        "fallback": (
            f"cells with < {tcfg['min_count']} records: pooled mean of the (2r+1)^2 neighbourhood "
            f"(r = 1 up to {MAX_RADIUS}), else the global mean"
        ),
        "binnings": binnings,
        "info_gain_bits": {n: b["entropy_bits"]["X"]["I"] for n, b in binnings.items()},
        "config": tcfg,
    }


def summarise(binnings: dict[str, Any]) -> dict[str, Any]:
    """Per binning, the few numbers worth a log line: cells, occupancy, I(X; S, A) rounded."""
    return {
        name: {
            "cells": b["cells"],
            "occupied": b["occupied"],
            "filled": b["filled_cells"],
            **{k: round(v, 4) for k, v in b["entropy_bits"]["X"].items() if k != "n"},
        }
        for name, b in binnings.items()
    }
