"""sprinter_train: acceptance predictors for speculative decoding (SPRINTER, SV, SVIP, MTAD)."""

__version__ = "0.1.0"
