"""Individual (per-document) filters: rho of each release against dp-accounting's RDP and
against brute-force Rényi divergences; the rho cap of an (epsilon, delta) target."""

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from scipy.special import logsumexp

from synthgen.privacy.individual import (
    RDP_ORDERS,
    DocumentBudget,
    bounded_range_rho,
    pure_rho,
    rho_cap,
    rho_epsilon,
)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.7])
def test_rho_epsilon_states_a_gaussians_rdp_curve(sigma):
    # dp-accounting's RDP of a Gaussian is exactly alpha / (2 sigma^2), rho = 1/(2 sigma^2):
    # the same statement.
    for delta in (1e-5, 1e-8):
        accountant = rdp_lib.RdpAccountant(list(RDP_ORDERS))
        accountant.compose(dp_event.GaussianDpEvent(sigma))
        assert rho_epsilon(1 / (2 * sigma**2), delta) == pytest.approx(
            accountant.get_epsilon(delta), rel=1e-9
        )


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.0])
def test_pure_rho_bounds_laplace_rdp_at_every_order(epsilon):
    # Bun & Steinke Prop. 1.4: pure epsilon => epsilon^2/2-zCDP; dp-accounting's exact
    # Laplace RDP curve must lie below alpha * rho at every order.
    accountant = rdp_lib.RdpAccountant(list(RDP_ORDERS))
    accountant.compose(dp_event.LaplaceDpEvent(1.0 / epsilon))
    rdp = np.asarray(accountant._rdp)  # the composed curve at RDP_ORDERS
    assert np.all(rdp <= RDP_ORDERS * pure_rho(epsilon) + 1e-12)


def _renyi(p, q, alpha):
    """D_alpha(p || q) in nats for discrete distributions (log-probabilities)."""
    return logsumexp(alpha * p + (1 - alpha) * q) / (alpha - 1)


def test_bounded_range_rho_bounds_the_exponential_mechanism():
    # Brute force: the exponential mechanism at epsilon on neighbouring utilities (each
    # utility moves by at most the sensitivity 1) has Rényi divergence <= alpha eps^2/8
    # (Cesar & Rogers 2021), and the worst case comes close to it.
    rng = np.random.default_rng(0)
    epsilon, worst = 1.2, 0.0
    for _ in range(300):
        size = int(rng.integers(2, 6))
        u = rng.uniform(0, 3, size)
        u2 = np.clip(u + rng.choice([-1.0, 0.0, 1.0], size), -10, 10)
        for a, b in ((u, u2), (u2, u)):
            p = epsilon * a / 2 - logsumexp(epsilon * a / 2)
            q = epsilon * b / 2 - logsumexp(epsilon * b / 2)
            for alpha in (1.5, 2.0, 4.0, 16.0):
                divergence = _renyi(p, q, alpha)
                assert divergence <= alpha * bounded_range_rho(epsilon) + 1e-12
                worst = max(worst, divergence / (alpha * bounded_range_rho(epsilon)))
    assert worst > 0.5  # the bound is not vacuous on these worlds


@pytest.mark.parametrize(("epsilon", "delta"), [(10.0, 1e-6), (1.0, 1e-5), (0.2, 1e-8)])
def test_rho_cap_is_the_largest_rho_within_the_target(epsilon, delta):
    cap = rho_cap(epsilon, delta)
    assert rho_epsilon(cap, delta) <= epsilon
    assert rho_epsilon(cap * (1 + 1e-6), delta) > epsilon
    # tighter than the closed form rho + 2 sqrt(rho log 1/delta) (Bun & Steinke Prop. 1.3)
    closed = cap + 2 * math.sqrt(cap * math.log(1 / delta))
    assert closed >= epsilon


def test_document_budget_refuses_past_the_cap_and_bad_targets():
    budget = DocumentBudget(epsilon=10.0, delta=1e-6)
    per_answer = budget.rho_cap / 40
    spent, answered = 0.0, 0
    while budget.fits(spent, per_answer):
        spent += per_answer
        answered += 1
    assert answered in (39, 40)  # 40 exactly, or 39 if the float sum rounds past the cap
    assert spent <= budget.rho_cap
    assert budget.spent_epsilon(spent) <= 10.0
    for bad in (dict(epsilon=0.0, delta=1e-6), dict(epsilon=1.0, delta=1.0)):
        with pytest.raises(ValueError):
            DocumentBudget(**bad)
    with pytest.raises(ValueError, match="rho must be"):
        rho_epsilon(-1.0, 1e-6)
