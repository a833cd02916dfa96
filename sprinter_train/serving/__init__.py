"""Serving engines running the project's drafts and predictors: vLLM (`serving.vllm`), an
optional extra in a venv of its own (`make vllm-setup`); nothing here is imported by the
pipeline's stages."""
