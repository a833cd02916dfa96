"""`harvest.interleaved_accept: auto`: the pair's acceptance, measured before the harvest.

alpha = the mean of beta = sum_v min(p, q) (the probability that speculative sampling keeps
a draft token: SD's acceptance rate, what draft_eval reports as alpha) over the records of
the `original` sequences (prompt + the dataset's own reply) of the first
`harvest.calibration_prompts` prompts, each teacher-forced alone. Why this source:

- it needs no generation and no draw (beta is an expectation over the draft's token), so it
  costs one forward per model a prompt and carries no sampling noise;
- the first prompts of the loaded list are the same for every shard plan, world size,
  `data.num_prompts` at least as large, and resume, and one sequence a forward keeps the
  padding of `harvest.batch_size` out of it;
- it is rounded to 4 decimals, so float noise below that (another BLAS, another GPU) does
  not change the harvest's fingerprint; every DDP rank uses rank 0's value.

The value goes into the harvest's settings, hence its fingerprint and manifest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from sprinter_train.core.sampling import SamplingConfig
from sprinter_train.data.prompts import Prompt
from sprinter_train.harvest.continuations import HarvestSequence, original_sequence
from sprinter_train.harvest.records import harvest_batch
from sprinter_train.models.roles import Roles

DECIMALS = 4  # the measured alpha's resolution (see the module docstring)


def accept_setting(value: object) -> float | None:
    """harvest.interleaved_accept: None for `auto` (measured later), else a number in (0, 1)."""
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ValueError(f"harvest.interleaved_accept must be auto or in (0, 1), got {value!r}")
    return float(value)


def measure_accept(
    models: Roles,
    prompts: Sequence[Prompt],
    length: int,
    sampling: SamplingConfig,
    device: torch.device,
) -> float:
    """Mean beta over the `original` regions (at most `length` positions each) of `prompts`,
    one sequence a forward, rounded and kept inside (0, 1)."""
    if not prompts:
        raise ValueError("harvest.interleaved_accept=auto needs at least one prompt")
    draft_and_target = replace(models, companion=None)  # beta reads q and p only
    betas = []
    for prompt in prompts:
        ids, start, end = original_sequence(prompt, models.tokenizer, length)
        sequence = HarvestSequence(prompt, "original", ids, start, end)
        batch = harvest_batch(draft_and_target, [sequence], sampling, -1, 0, device)
        betas.append(batch.columns["beta"].astype(np.float64))
    alpha = round(float(np.concatenate(betas).mean()), DECIMALS)
    step = 10.0**-DECIMALS
    return min(max(alpha, step), 1.0 - step)
