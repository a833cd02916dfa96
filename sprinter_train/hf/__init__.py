"""Hugging Face `generate` for the trained predictors: SPRINTER, sd_learned, SV and SVIP as
`custom_generate` callables that run the engine with the method's policy, and the export
folder they are copied into.

methods.py makes the callables and the folder's entry, prepare.py takes what transformers'
`generate` prepared to one run of the engine (decoding/engine.py) and back, bundle.py reads a
folder's predictors with the package's own readers, identity.py checks the draft is the one an
export was made for. stage=export copies those modules and every module they import (the
engine, the policies, the predictors' readers) into custom_generate/ with vendor.py, where
transformers loads them with nothing but torch, transformers, safetensors and numpy installed;
folder.py writes the folder. Batch size 1.

    from sprinter_train import hf
    out = target.generate(**inputs, custom_generate=hf.sd_learned, draft_model=draft,
                          verifier="checkpoints/<exp>/verifier-accept.safetensors",
                          latency="artifacts/<exp>/bench/latency.json", max_new_tokens=64)
"""

from sprinter_train.hf.methods import METHODS, sd_learned, sprinter, sv, svip

__all__ = ["METHODS", "sd_learned", "sprinter", "sv", "svip"]
