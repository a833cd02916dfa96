"""What the bench writes: results.json and results.md (`results_md.py`), assembled from its
opening lines (`header_lines.py`), tables (`tables.py`), the bars met or not (`verdicts.py`),
untimed work (`timing_lines.py`), each learned length's section (`learned_lines.py`), the
lossy frontier's (`frontier_lines.py`) and vLLM's peers' (`vllm_lines.py`); the
plots (`plots.py`), the figures per method (`summary.py`), the share of the oracle's gain
(`oracle.py`) and how a figure is written (`cells.py`)."""
