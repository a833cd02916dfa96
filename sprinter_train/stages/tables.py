"""stage=tables: SV's P(accept | S, A) tables and the information S and A carry (SV §4.2, §7.4).

python -m sprinter_train stage=tables experiment=<exp>

Reads artifacts/<exp>/records/ (stage=harvest, with a companion model: S and A); writes
artifacts/<exp>/tables/sv_table.json (edges, counts, P(accept) per cell for every binning,
H(X), H(X | S, A), I(X; S, A)) and sv_table.png (the default table as a heat map).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from sprinter_train.core.io import write_json
from sprinter_train.evaluation.information import discretise, information
from sprinter_train.evaluation.plots import plot_sv_table
from sprinter_train.evaluation.predictors import sampled_acceptance
from sprinter_train.harvest.manifest import code_version
from sprinter_train.harvest.reader import RecordSet, open_records
from sprinter_train.sv.table import MAX_RADIUS, Binning, fit_binning

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
COLUMNS = ["split", "S", "A", "accept_prob", "ratio"]


def acceptance_codes(frame, x_bins: int, seed: int) -> dict[str, np.ndarray]:
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


def require_companion(records: RecordSet, stage: str) -> None:
    if not records.has_companion:
        raise ValueError(
            f"{stage} needs SV's S and A, which need a companion model, but the records of "
            f"{records.records_dir} were harvested without one (models.companion null). "
            "Harvest again with a companion: the offline default's is "
            "checkpoints/drafts/smollm2-companion (`python -m sprinter_train stage=distill "
            "distill=companion`), or set models.companion.path"
        )


def entropies(binning: Binning, frame, x_bins: int, seed: int) -> dict[str, Any]:
    cells = binning.flat(frame["S"].to_numpy(), frame["A"].to_numpy())
    return {
        name: information(codes, cells)
        for name, codes in acceptance_codes(frame, x_bins, seed).items()
    }


def build_tables(frame, tcfg: dict[str, Any]) -> dict[str, Any]:
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


def run(cfg: DictConfig) -> dict[str, Any]:
    tcfg: dict[str, Any] = OmegaConf.to_container(cfg.tables, resolve=True)  # type: ignore[assignment]
    records = open_records(cfg.experiment_dir, columns=COLUMNS, stage="stage=tables")
    require_companion(records, "stage=tables")
    fit = records.frame[records.frame["split"].isin(tcfg["fit_splits"])]
    if len(fit) == 0:
        raise ValueError(f"stage=tables: no records in splits {tcfg['fit_splits']}")
    binnings = build_tables(fit, tcfg)
    if tcfg["default"] not in binnings:
        raise ValueError(f"tables.default={tcfg['default']!r} is none of {list(binnings)}")
    payload = {
        "stage": "tables",
        "schema_version": SCHEMA_VERSION,
        "experiment": str(cfg.experiment),
        "records": {
            "dir": str(records.records_dir),
            "manifest_sha256": records.manifest_hash,
            "content_id": records.content_id,
            "fingerprint": records.manifest.get("fingerprint"),
            "companion": records.manifest.get("models", {}).get("companion", {}).get("id"),
        },
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
        "code_version": code_version(),
    }
    out_dir = Path(cfg.experiment_dir) / "tables"
    path = write_json(out_dir / "sv_table.json", payload)
    plot_sv_table(
        binnings[tcfg["default"]], out_dir / "sv_table.png", f"SV table ({tcfg['default']})"
    )
    summary = {
        name: {
            "cells": b["cells"],
            "occupied": b["occupied"],
            "filled": b["filled_cells"],
            **{k: round(v, 4) for k, v in b["entropy_bits"]["X"].items() if k != "n"},
        }
        for name, b in binnings.items()
    }
    log.info("SV tables from %d records -> %s: %s", len(fit), path, summary)
    return {"table": str(path), "rows": len(fit), "binnings": summary}
