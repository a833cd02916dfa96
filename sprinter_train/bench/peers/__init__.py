"""The decoders our engine is timed against: Hugging Face assisted generation
(`hf_assisted.py`) and the target alone through `generate` with a static cache (`hf_static.py`)."""
