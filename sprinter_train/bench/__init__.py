"""Speculative-decoding benchmark: decoding runs and their speed and quality metrics."""
