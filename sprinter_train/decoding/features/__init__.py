"""The verifier's decode-time features, each declared once: the table every reader derives
from (`table.py`), the kinds a feature can be (`types.py`) and the built-in features
(`builtins.py`)."""
