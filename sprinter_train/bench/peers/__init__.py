"""The decoders our engine is timed against: Hugging Face assisted generation
(`hf_assisted.py`), the target alone through `generate` with a static cache (`hf_static.py`)
and vLLM, alone and speculative, in a process of its own (`vllm_peer.py`)."""
