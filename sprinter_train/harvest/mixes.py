"""SPRINTER §3.2 prefix mixes: which kind of prefix each prompt contributes.

The verifier sees, at inference, prefixes of dataset text, draft text, target text and the
interleaving its own decoder produces (draft runs kept as drawn between target tokens), so
the harvest draws records from all four in equal shares by default. `sd_interleaved`, the
interleaving lossless speculative decoding produces (target law), can be mixed in by weight. Assignment depends only on the prompt order, ids and the seed, so
every process, every resume and every world size agrees on it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from fractions import Fraction

MIXES: tuple[str, ...] = ("original", "draft", "target", "interleaved")  # SPRINTER's four
KNOWN_MIXES: tuple[str, ...] = (*MIXES, "sd_interleaved")  # what harvest.mix_weights may name


def stable_int(*parts: object) -> int:
    """A 63-bit integer hash of `parts`, identical on every machine and Python run."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


def prompt_seed(seed: int, prompt_id: str, purpose: str) -> int:
    """Seed of one prompt's generator: records never depend on batch or shard neighbours."""
    return stable_int("harvest", seed, purpose, prompt_id)


def assign_mixes(prompt_ids: Sequence[str], weights: Mapping[str, float], seed: int) -> list[str]:
    """One mix per prompt, in order; every prefix of the list is within one prompt of its quota.

    Each prompt goes to the mix furthest below its quota (weight share times prompts so far);
    ties, which occur at every block of equal weights, are broken by a hash of the prompt id
    and seed, so within each block the order of mixes is a seeded shuffle. A plain hash per
    prompt would leave the shares uneven by chance.
    """
    unknown = set(weights) - set(KNOWN_MIXES)
    if unknown:
        raise ValueError(
            f"unknown mixes {sorted(unknown)} in harvest.mix_weights; use {KNOWN_MIXES}"
        )
    shares = {m: Fraction(str(weights.get(m, 0))) for m in KNOWN_MIXES}
    if any(w < 0 for w in shares.values()) or sum(shares.values()) <= 0:
        raise ValueError(f"harvest.mix_weights must be >= 0 with a positive sum, got {weights}")
    total = sum(shares.values())
    shares = {m: w / total for m, w in shares.items()}
    counts = dict.fromkeys(KNOWN_MIXES, 0)
    mixes = []
    for index, prompt_id in enumerate(prompt_ids):

        def deficit(m: str, index: int = index, prompt_id: str = prompt_id) -> tuple:
            return (shares[m] * (index + 1) - counts[m], stable_int("mix", seed, prompt_id, m))

        chosen = max((m for m in KNOWN_MIXES if shares[m] > 0), key=deficit)
        counts[chosen] += 1
        mixes.append(chosen)
    return mixes
