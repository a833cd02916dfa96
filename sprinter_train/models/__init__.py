"""Model loading, the tokenizer-agreement check and the distilled student architecture."""
