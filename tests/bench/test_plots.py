"""Plotting leaves matplotlib's global state alone: importing or drawing selects no backend."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

DRAW = """
import sys
from pathlib import Path

import matplotlib

matplotlib.use("svg")  # a caller's choice (a notebook's inline backend, a GUI) ...
import sprinter_train.bench.report.plots
from sprinter_train.core.plots import plot_curve
from sprinter_train.evaluation.plots import plot_roc

out = Path(sys.argv[1])
roc = plot_roc({"v": {"fpr": [0, 0.5, 1], "tpr": [0, 0.8, 1], "auc": 0.7}}, out / "roc.png", "t")
curve = plot_curve([{"tokens": 1e6, "loss": 2.0, "heldout_alpha_t1": 0.5}], out / "c.png", "t")
assert matplotlib.get_backend() == "svg", matplotlib.get_backend()  # ... survives
assert "matplotlib.pyplot" not in sys.modules
print(roc.read_bytes()[:8] == curve.read_bytes()[:8] == b"\\x89PNG\\r\\n\\x1a\\n")
"""


@pytest.mark.heavy  # another process
def test_drawing_keeps_the_callers_backend_and_needs_no_pyplot(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", DRAW, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"  # both figures were written as PNG


def test_a_learning_curve_without_a_defined_auc_is_drawn_as_a_note(tmp_path) -> None:
    """At T = 0 every draft may be accepted: one class, no AUC at any size. The figure says
    so instead of failing evaluate in matplotlib's log axis ("Data cannot be log-scaled")."""
    from sprinter_train.evaluation.plots import plot_learning_curves

    undefined = {"test_auc_q_le_p": None, "val_auc_q_le_p": None}
    curves = {"verifier_lam1.2": {"points": [{"train_rows": n, **undefined} for n in (64, 128)]}}
    path = plot_learning_curves(curves, tmp_path / "auc_vs_records.png", 0.8)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
