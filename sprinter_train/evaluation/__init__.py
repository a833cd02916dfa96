"""Predictor scores and metrics, SV's table on held-out records, the SPRINTER theorems and the
evaluation report: one module per section of eval/report.json, called by stages/evaluate.py."""
