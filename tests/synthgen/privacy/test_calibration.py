"""The calibration tools every calibration calls (`synthgen.privacy.calibration`)."""

import math

import dp_accounting
import pytest

from synthgen.privacy import calibration
from synthgen.privacy.accountants import epsilon, make_accountant


def test_bisect_returns_the_feasible_end_within_the_tolerance():
    boundary = math.sqrt(2)
    below = calibration.bisect(lambda x: x <= boundary, 0.0, 4.0, abs_tol=1e-9)
    above = calibration.bisect(lambda x: x >= boundary, 4.0, 0.0, abs_tol=1e-9)
    assert below <= boundary < below + 1e-9
    assert above - 1e-9 < boundary <= above
    relative = calibration.bisect(lambda x: x <= 1e-3, 1e-9, 1.0, geometric=True, rel_tol=1e-6)
    assert 1e-3 * (1 - 2e-6) < relative <= 1e-3


def test_bisect_by_integers_and_by_a_count_of_halvings():
    assert calibration.bisect(lambda n: n >= 37, 1000, 0, integer=True) == 37
    assert calibration.bisect(lambda n: n <= 37, 0, 1000, integer=True) == 37
    # one halving only: the feasible end moves once, to the midpoint
    assert calibration.bisect(lambda x: x <= 3.0, 0.0, 4.0, iterations=1) == 2.0
    assert calibration.bisect(lambda x: x <= 3.0, 0.0, 4.0, iterations=0) == 0.0


def test_grow_doubles_until_the_condition_fails_or_refuses_past_the_limit():
    assert calibration.grow(lambda x: x < 10, 0.0, 1.0) == (8.0, 16.0)
    assert calibration.grow(lambda x: x < 0, 0.5, 1.0) == (0.5, 1.0)
    with pytest.raises(ValueError, match="too far"):
        calibration.grow(lambda x: True, 0.0, 1.0, limit=100, error="too far")


def test_calibrate_event_meets_the_target_and_is_near_the_least_noise():
    target, delta, tol = 2.0, 1e-5, 1e-4

    def event(sigma):
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), 10)

    sigma = calibration.calibrate_event(
        event, make_accountant, target_epsilon=target, delta=delta, lower=0.5, upper=20.0, tol=tol
    )
    assert epsilon(event(sigma), delta) <= target
    assert epsilon(event(sigma - 2 * tol), delta) > target
