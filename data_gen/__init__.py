"""Data generation for distillation: tokenised corpora and cached teacher distributions."""
