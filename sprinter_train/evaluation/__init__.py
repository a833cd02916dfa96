"""Predictor metrics, information measures, the SPRINTER theorems and the evaluation report."""
