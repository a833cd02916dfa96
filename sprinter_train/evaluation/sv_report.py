"""SV's table on the evaluated split: how much (S, A) tell about X there, and its calibration.

The table was fitted on tables.fit_splits; here the same cells are read on the test split,
and the held-out gain says whether the fitted cells generalise (the plug-in gain can't).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from sprinter_train.harvest.reader import RecordSet
from sprinter_train.sv.information import discretise, heldout_information, information
from sprinter_train.sv.table import SVTable

NO_TABLE_NOTE = (
    "sv_table: the records have no S and A (harvested without a companion), so there is "
    "no SV table to score"
)


def information_report(
    records: RecordSet, table: SVTable, test_rows: np.ndarray
) -> tuple[dict[str, Any], float]:
    """Per binning: entropies on the fit split (from the table), on the test split, and the
    held-out gain; returns the test plug-in I(X; S, A) of the default binning too."""
    payload = table.meta
    x_bins = int(payload["config"]["x_bins"])
    frame = records.frame
    fit_rows = np.flatnonzero(frame["split"].isin(payload["fit_splits"]).to_numpy())
    x = discretise(frame["accept_prob"].to_numpy(), x_bins)
    out: dict[str, Any] = {}
    for name in payload["binnings"]:
        binning = SVTable.from_json(payload, name).binning
        cells = binning.flat(frame["S"].to_numpy(), frame["A"].to_numpy())
        out[name] = {
            "fit": payload["binnings"][name]["entropy_bits"]["X"],
            "test": information(x[test_rows], cells[test_rows]),
            "heldout": heldout_information(
                x[fit_rows], cells[fit_rows], x[test_rows], cells[test_rows], x_bins
            ),
        }
    return out, out[payload["default"]]["test"]["I"]


def table_calibration(table: SVTable, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per cell: the table's value and the test split's mean min(1, p/q) and count."""
    flat = table.binning.flat(frame["S"].to_numpy(), frame["A"].to_numpy())
    cells = table.p_accept.size
    counts = np.bincount(flat, minlength=cells)
    sums = np.bincount(flat, weights=frame["accept_prob"].to_numpy(), minlength=cells)
    with np.errstate(invalid="ignore", divide="ignore"):
        observed = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return {"predicted": table.p_accept.ravel(), "observed": observed, "counts": counts}
