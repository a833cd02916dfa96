"""notebooks/analysis.ipynb runs top to bottom on a tiny experiment and is committed clean."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from sprinter_train.__main__ import run_stage
from tests.synthetic import SYNTHETIC_FEATURES, write_synthetic_records

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "analysis.ipynb"


def test_the_notebook_is_committed_without_outputs() -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    assert notebook.cells[1].source.startswith("# parameters")


@pytest.mark.heavy
def test_the_notebook_executes_on_a_tiny_experiment(compose_cfg, tmp_path) -> None:
    pytest.importorskip("ipykernel")
    write_synthetic_records(tmp_path / "artifacts" / "nb", rows=4096, d=8, shard_rows=1024)
    common = (
        "experiment=nb",
        f"checkpoints_root={tmp_path / 'checkpoints'}",
        "train.batch_size=512",
        SYNTHETIC_FEATURES,
    )
    for stage in ("train", "tables", "evaluate"):
        run_stage(compose_cfg(f"stage={stage}", *common))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    notebook.cells[1].source = f'# parameters\nEXPERIMENT_DIR = "{tmp_path / "artifacts" / "nb"}"'
    NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 3  # records, ROC curves, SV table
    text = "".join(
        str(o.get("data", {}).get("text/plain", "")) + o.get("text", "") for o in outputs
    )
    assert "verifier_lam1.2" in text and "3.1 measured d_TV" in text
