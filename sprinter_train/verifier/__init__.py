"""SPRINTER's verifier: records -> Lightning training -> exported linear+sigmoid checkpoints."""
