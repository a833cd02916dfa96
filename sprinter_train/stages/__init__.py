"""One module per stage, each exposing run(cfg) -> dict of metrics."""
