"""The KV caches a runner keeps its rows in: growing rows (`rows.py`), preallocated static
buffers with a slot map (`static.py`) and the shapes those buffers are bucketed to
(`shapes.py`)."""
