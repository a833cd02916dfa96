"""What the bench writes: results.json, results.md and plots (`report.py`), the figures per
method (`summary.py`), the share of the oracle's gain (`oracle.py`) and how a figure is
written (`cells.py`)."""
