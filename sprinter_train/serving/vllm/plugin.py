"""The `vllm.general_plugins` entry point (pyproject.toml): vLLM calls `register` in every
process it starts, before it reads a model's config."""

from __future__ import annotations

import os

PREDICTOR_ENV = "SPRINTER_VLLM_PREDICTOR"


def register() -> None:
    """Register the draft's config and model class with transformers and vLLM, fix vLLM's
    CPU rejection sampler's temperatures (cpu_fixes.py), and, where
    `SPRINTER_VLLM_PREDICTOR` names an `stage=export export.method=sd_learned` folder, let its
    predictor choose each request's draft length (proposer.py). Safe to call twice."""
    from vllm import ModelRegistry

    import sprinter_train.models.student  # noqa: F401  (registers the draft's config)
    from sprinter_train.serving.vllm import cpu_fixes
    from sprinter_train.serving.vllm.draft_model import ARCHITECTURE

    cpu_fixes.install()  # sampled speculative decoding lossless on vLLM's CPU build

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(
            ARCHITECTURE, "sprinter_train.serving.vllm.draft_model:SprinterDraftForCausalLM"
        )
    folder = os.environ.get(PREDICTOR_ENV)
    if folder:
        from sprinter_train.serving.vllm.proposer import install

        install(folder)
