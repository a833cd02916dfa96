"""stage=tables: SV's P(accept | S, A) tables and the information S and A carry (SV §4.2, §7.4).

python -m sprinter_train stage=tables experiment=<exp>

Reads artifacts/<exp>/records/ (stage=harvest, with a companion model: S and A); writes
artifacts/<exp>/tables/sv_table.json (edges, counts, P(accept) per cell for every binning,
H(X), H(X | S, A), I(X; S, A)) and sv_table.png (the default table as a heat map). The fitting
is sv/fit.py's; this module reads, calls and writes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sprinter_train.core import pidlock
from sprinter_train.core.io import write_json
from sprinter_train.data.overlap import fitted_prompts
from sprinter_train.evaluation.plots import plot_sv_table
from sprinter_train.harvest.manifest import code_version
from sprinter_train.harvest.reader import open_records, verify_hashes
from sprinter_train.sv.fit import COLUMNS, fit_tables, require_companion, summarise
from sprinter_train.sv.table import sealed

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2  # 2: sealed with content_sha256, with model identities and fitted prompts


def run(cfg: DictConfig) -> dict[str, Any]:
    with pidlock.experiment_writer(cfg.experiment_dir, "tables"):
        return _run(cfg)


def _run(cfg: DictConfig) -> dict[str, Any]:
    tcfg: dict[str, Any] = OmegaConf.to_container(cfg.tables, resolve=True)  # type: ignore[assignment]
    records = open_records(
        cfg.experiment_dir,
        columns=[*COLUMNS, "prompt_id"],
        stage="stage=tables",
        verify=verify_hashes(cfg),
    )
    require_companion(records, "stage=tables")
    fitted = fit_tables(records.frame, tcfg)
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
        # the harvest's model identities, compared by the bench and export with what they run
        "models": records.manifest.get("models") or {},
        "fitted_prompts": fitted_prompts(
            records.frame["prompt_id"][records.frame["split"].isin(tcfg["fit_splits"])]
            .astype(str)
            .unique(),
            tcfg["fit_splits"],
        ),
        **fitted,
        "code_version": code_version(),
    }
    out_dir = Path(cfg.experiment_dir) / "tables"
    path = write_json(out_dir / "sv_table.json", sealed(payload))
    default = tcfg["default"]
    plot_sv_table(fitted["binnings"][default], out_dir / "sv_table.png", f"SV table ({default})")
    summary = summarise(fitted["binnings"])
    log.info("SV tables from %d records -> %s: %s", fitted["rows"], path, summary)
    return {"table": str(path), "rows": fitted["rows"], "binnings": summary}
