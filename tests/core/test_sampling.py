"""core.sampling.sample over many rows: each row's draws follow its own distribution, and a
row's token depends only on its probabilities and its place in the generator's stream."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from sprinter_train.core.sampling import inverse_cdf, sample

LAWS = torch.tensor(
    [
        [0.0, 0.1, 0.0, 0.6, 0.3, 0.0],
        [0.25, 0.25, 0.25, 0.25, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
        [0.05, 0.05, 0.1, 0.2, 0.3, 0.3],
    ],
    dtype=torch.float64,
)


def test_rows_follow_their_own_distributions() -> None:
    """20 000 draws of each law, interleaved in one (N, V) call (and unnormalised rows)."""
    draws = 20_000
    scale = torch.tensor([1.0, 3.0, 0.5, 7.0], dtype=torch.float64)[:, None]
    probs = (LAWS * scale).float().repeat(draws, 1)  # row i has law i % 4
    tokens = sample(probs, torch.Generator().manual_seed(0)).numpy()
    assert tokens.shape == (4 * draws,) and tokens.dtype == np.int64
    for law, row in enumerate(LAWS.numpy()):
        counts = np.bincount(tokens[law::4], minlength=row.size)
        assert counts[row == 0].sum() == 0  # a zero-probability token is never drawn
        support = row > 0
        if support.sum() > 1:
            assert chisquare(counts[support], draws * row[support]).pvalue > 1e-3


def test_a_rows_token_depends_on_its_probabilities_and_stream_place_only() -> None:
    generator = torch.Generator().manual_seed(7)
    probs = LAWS[torch.tensor([3, 0, 1, 3, 3])].float()
    tokens = sample(probs, generator)
    other = probs.clone()
    other[[0, 2, 4]] = LAWS[2].float()  # change every row but 1 and 3
    again = sample(other, torch.Generator().manual_seed(7))
    assert again[1] == tokens[1] and again[3] == tokens[3]
    # the documented order: row i takes the i-th uniform of one torch.rand call
    u = torch.rand(6, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    assert torch.equal(tokens, inverse_cdf(probs, u[:5]))
    # and it took exactly one number per row: the stream goes on at the sixth
    assert torch.equal(torch.rand(1, generator=generator, dtype=torch.float64), u[5:])


def test_one_row_is_the_first_row_of_many() -> None:
    one = sample(LAWS[3], torch.Generator().manual_seed(11))
    many = sample(LAWS[[3, 0]], torch.Generator().manual_seed(11))
    assert one.shape == () and int(one) == int(many[0])


@pytest.mark.parametrize("u", [0.0, 1.0 - 2.0**-53])
def test_the_ends_of_the_unit_interval_land_on_tokens_with_mass(u: float) -> None:
    probs = torch.tensor([[0.0, 0.3, 0.7, 0.0], [0.0, 0.0, 1.0, 0.0]])
    tokens = inverse_cdf(probs, torch.full((2,), u, dtype=torch.float64))
    assert all(probs[r, t] > 0 for r, t in enumerate(tokens.tolist()))
