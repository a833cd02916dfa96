"""stage=draft_eval: what it measures of a draft (`evaluate.py`), the exchanges it scores on
(`exchanges.py`) and its table, verdicts and model card (`report.py`)."""
