"""The distilled draft and the trained predictor inside vLLM (0.32, pinned in
requirements-vllm.lock).

- `draft_model`: `SprinterDraftForCausalLM` as a vLLM model (factorised embedding,
  restricted head scattered into the vocabulary with -inf elsewhere), so
  `speculative_config={"method": "draft_model", "model": "checkpoints/drafts/smollm2-draft"}`
  drafts with the exact draft;
- `plugin`: the `vllm.general_plugins` entry point registering it (and, with
  `SPRINTER_VLLM_PREDICTOR` set, the predictor);
- `predictor`: sd_learned's verifier and stop rule, per request and draft step, from an
  `stage=export export.method=sd_learned` folder;
- `proposer`: where the predictor enters vLLM's draft loop.

Importing this package imports no vLLM: the modules that need it import it themselves.
"""
