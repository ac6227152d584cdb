"""The batch sampler's fixed Poisson rate (used by audits whose dataset size varies)."""

import numpy as np
import pytest
import scipy.stats

from synthgen.batching import BatchSampler


def test_fixed_rate_draws_each_example_at_that_rate():
    sampler = BatchSampler(500, 50, 16, "poisson", np.random.default_rng(0), rate=0.05)
    assert sampler.sampling_rate == 0.05  # not 50 / 500
    drawn = sum(len(sampler.sample()) for _ in range(200))
    assert scipy.stats.binomtest(drawn, 500 * 200, 0.05).pvalue > 1e-3


def test_fixed_rate_needs_poisson_sampling():
    with pytest.raises(ValueError):
        BatchSampler(500, 50, 16, "shuffle", np.random.default_rng(0), rate=0.05)
    with pytest.raises(ValueError):
        BatchSampler(500, 50, 16, "poisson", np.random.default_rng(0), rate=0.0)
