"""sprinter_train: acceptance predictors for speculative decoding (SPRINTER, SV, SVIP, MTAD).

Layers, lowest first. A module imports only from its own package or from a lower layer
(tests/test_layers.py reads this list and every module's imports):

    core: sampling, acceptance rules, metrics, I/O, plots
    models, data: loading and the model forward; prompts and splits
    decoding: the engine, its KV caches and one policy per method
    harvest, distill: records written and read; the distilled draft
    verifier, sv: SPRINTER's verifier and SV's table, fitted on records
    evaluation, bench: reports on records and predictors; end-to-end decoding runs
    hf: Hugging Face `generate` running the engine with an exported method's policy, and the
        export folder that carries those modules with it
    serving: the draft and an exported predictor inside vLLM (an optional venv of its own)
    stages: one run(cfg) per stage and the registry
    __main__: the Hydra entry point

docs/architecture.md draws the data flow between them.
"""

__version__ = "0.1.0"
