"""The tiny pipeline's settings, shared by the tests that chain harvest -> train -> tables ->
evaluate on tiny models."""

from __future__ import annotations

# tiny models, 16 prompts of 8 records each, a quarter of the prompts each in val and test
TINY_CHAIN = (
    "models=tiny_random",
    "device=cpu",
    "dtype=float32",  # tests compare against float32 recomputations
    "num_threads=1",
    "data.num_prompts=16",
    "data.max_prompt_tokens=48",
    "data.val_fraction=0.25",
    "data.test_fraction=0.25",
    "harvest.continuation_tokens=8",
    "harvest.batch_size=8",
    "train.batch_size=64",
    "tables.min_count=5",
)
