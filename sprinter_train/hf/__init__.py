"""Hugging Face `generate` for the trained predictors: SPRINTER, sd_learned, SV and SVIP as
`custom_generate` callables, and the code of an exported folder's custom_generate/.

This package imports nothing from sprinter_train (tests/test_layers.py keeps it at the lowest
layer): stage=export copies its modules verbatim into custom_generate/, where transformers
loads them with nothing but torch and transformers installed. Batch size 1.

    from sprinter_train import hf
    out = target.generate(**inputs, custom_generate=hf.sd_learned, draft_model=draft,
                          verifier="checkpoints/<exp>/verifier-accept.safetensors",
                          latency="artifacts/<exp>/bench/latency.json", max_new_tokens=64)
"""

from .methods import METHODS, sd_learned, sprinter, sv, svip

__all__ = ["METHODS", "sd_learned", "sprinter", "sv", "svip"]
