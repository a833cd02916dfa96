"""RowStreams against SplitMix64 written out in Python integers: every draw is the number at
its row's counter, however the calls, the partial advances, the draws shown before they are
taken, the rows leaving and the block refills fall."""

from __future__ import annotations

import torch

from sprinter_train.core.streams import BLOCK, RowStreams

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix(x: int) -> int:
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def key(seed: int) -> int:
    return mix((seed * GOLDEN + 1) & MASK)


def number(seed: int, index: int) -> float:
    """Draw `index` of the row seeded `seed`, as a float64 in [0, 1)."""
    return (mix((key(seed) + index * GOLDEN) & MASK) >> 11) / float(1 << 53)


def grid_number(seed: int, index: int, k: int) -> float:
    """Entry k of the wide draw keyed by the row's number at `index`."""
    wide = mix((key(seed) + index * GOLDEN) & MASK)
    return (mix((wide + (k + 1) * GOLDEN) & MASK) >> 11) / float(1 << 53)


def test_draws_are_the_numbers_at_each_rows_counter() -> None:
    seeds = [0, 1, 2**40 + 7, -3]
    streams = RowStreams(seeds)
    counter = [0] * len(seeds)
    gen = torch.Generator().manual_seed(0)
    for call in range(3 * BLOCK):
        n = [1, 1, 3, 0, 1, 5, BLOCK + 2][call % 7]
        counts = torch.randint(0, n + 1, (len(seeds),), generator=gen)
        if call % 5 == 4:  # MTAD's wide draw takes one number
            counts = counts.clamp(max=1)
        if counts.max() <= 1 and call % 2:  # the engine's active rows draw one each
            counts = counts.bool()
            drawn = streams.grid(3, counts)
            want = [
                [grid_number(s, c, k) for k in range(3)]
                for s, c in zip(seeds, counter, strict=True)
            ]
            n = 1
        else:
            given = None if call % 3 == 0 else counts
            if call % 4 == 1:  # shown first, taken after (the draws the engine's graphs make)
                drawn = streams.peek(n)
                assert torch.equal(streams.peek(n), drawn)  # showing moves no counter
                streams.advance(n, given)
            else:
                drawn = streams.uniform(n, given)
            want = [
                [number(s, c + k) for k in range(n)] for s, c in zip(seeds, counter, strict=True)
            ]
            if call % 3 == 0:
                counts = torch.full((len(seeds),), n)
        assert drawn.dtype == torch.float64
        assert drawn.tolist() == want, f"call {call}"
        counter = [c + int(a) for c, a in zip(counter, counts, strict=True)]
        assert streams.counters.tolist() == counter
        if call == BLOCK:  # rows leave and one is repeated (MTAD's beams)
            keep = [3, 0, 0]
            streams = streams.select(torch.tensor(keep))
            seeds = [seeds[r] for r in keep]
            counter = [counter[r] for r in keep]


def test_seeds_from_the_host_key_the_streams_the_device_would() -> None:
    """A list of seeds is hashed in Python integers (one transfer, not a dozen device ops a
    batch); a tensor of seeds on the device: the same keys, the same draws, wrapping as int64
    does for negative and large seeds."""
    seeds = [0, 1, -1, 7, 2**40 + 3, -(2**62), 2**63 - 1]
    host, device = RowStreams(seeds), RowStreams(torch.tensor(seeds))
    assert torch.equal(host.keys, device.keys)
    assert torch.equal(host.uniform(BLOCK + 3), device.uniform(BLOCK + 3))
