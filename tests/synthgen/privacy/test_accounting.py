"""Accounting against dp-accounting and published golden values."""

import json
import math

import dp_accounting
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant

from synthgen.cli import app, run
from synthgen.privacy import accounting
from synthgen.privacy.errors import UnsupportedEventError

REL = dp_accounting.NeighboringRelation


def test_golden_opacus_values():
    # Opacus accountant tests (opacus/tests/accountants_test.py): Poisson-subsampled
    # Gaussian, sigma=1.5, q=0.04, 2250 steps, delta=1e-5 -> RDP 7.3291, PLD 6.7688.
    kwargs = dict(
        noise_multiplier=1.5, num_examples=25_000, batch_size=1_000, steps=2250, delta=1e-5
    )
    assert accounting.dpsgd_epsilon(accountant="rdp", **kwargs) == pytest.approx(7.329, abs=2e-3)
    assert accounting.dpsgd_epsilon(accountant="pld", **kwargs) == pytest.approx(6.769, abs=2e-3)


def _reference_epsilon(sigma, n, b, steps, delta, sampling, accountant):
    """Epsilon computed directly with dp-accounting, independent of our event builders."""
    q = b / n
    if sampling == "poisson" and accountant == "rdp":
        acc = rdp_privacy_accountant.RdpAccountant()
        acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
        return acc.get_epsilon(delta)
    # Fixed-size batches under replace-one: a subsampled Gaussian at sensitivity 2C, i.e.
    # multiplier sigma / 2 (the WOR RDP bound's multiplier is relative to that sensitivity).
    if sampling == "shuffle" and accountant == "rdp":
        acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=REL.REPLACE_ONE)
        gaussian = dp_event.GaussianDpEvent(sigma / 2)
        acc.compose(dp_event.SampledWithoutReplacementDpEvent(n, b, gaussian), steps)
        return acc.get_epsilon(delta)
    pld = pld_lib.from_gaussian_mechanism(
        standard_deviation=sigma if sampling == "poisson" else sigma / 2,
        sampling_prob=q,
        neighboring_relation=REL.ADD_OR_REMOVE_ONE,
        value_discretization_interval=1e-4,
    ).self_compose(steps)
    return pld.get_epsilon_for_delta(delta)


def _calculator(*args):
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run(app, ["privacy", "dpsgd", *args, "--json"])
    assert code == 0
    return json.loads(out.getvalue())


@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_calculator_matches_dp_accounting(sampling, accountant):
    n, b, epochs, delta, sigma = 60_000, 256, 15, 1e-5, 1.1
    got = _calculator(
        "--num-examples",
        str(n),
        "--batch-size",
        str(b),
        "--epochs",
        str(epochs),
        "--delta",
        str(delta),
        "--noise-multiplier",
        str(sigma),
        "--sampling",
        sampling,
        "--accountant",
        accountant,
    )
    steps = math.ceil(epochs * n / b)
    assert got["steps"] == steps
    assert got["sampling_rate"] == pytest.approx(b / n)
    assert got["accountant"] == accountant
    want = _reference_epsilon(sigma, n, b, steps, delta, sampling, accountant)
    assert got["epsilon"] == pytest.approx(want, rel=5e-4)  # 3 significant digits


@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
def test_calibration_hits_target(sampling):
    kw = dict(
        num_examples=10_000,
        batch_size=100,
        steps=1000,
        delta=1e-5,
        sampling=sampling,
        accountant="rdp",
    )
    sigma = accounting.calibrate_noise_multiplier(target_epsilon=4.0, **kw)
    assert accounting.dpsgd_epsilon(noise_multiplier=sigma, **kw) <= 4.0
    assert accounting.dpsgd_epsilon(noise_multiplier=sigma - 0.01, **kw) > 4.0


def test_calibration_pld_via_cli():
    got = _calculator(
        "--num-examples",
        "10000",
        "--batch-size",
        "200",
        "--epochs",
        "3",
        "--delta",
        "1e-5",
        "--target-epsilon",
        "2",
    )
    assert got["epsilon"] <= 2.0
    assert got["epsilon"] == pytest.approx(2.0, abs=0.01)
    assert got["noise_multiplier"] > 0.3


def test_heterogeneous_composition_is_between_max_and_sum():
    delta = 1e-5
    parts = [
        accounting.gaussian_event(3.0),
        accounting.laplace_event(0.5),
        accounting.pure_epsilon_event(0.3),
        accounting.poisson_sampled(0.01, accounting.gaussian_event(1.0)),
    ]
    # Standalone epsilons at delta/4 each; basic composition of those bounds the total.
    alone = [accounting.epsilon(e, delta / 4) for e in parts]
    total = accounting.epsilon(accounting.compose(parts), delta)
    assert max(alone) < total < sum(alone)


def test_pure_and_approximate_events():
    eps = accounting.epsilon(accounting.pure_epsilon_event(0.7), 1e-6)
    assert eps == pytest.approx(0.7, abs=1e-3)
    # An (epsilon, delta) event stated at its own delta returns its epsilon.
    eps = accounting.epsilon(accounting.epsilon_delta_event(1.0, 1e-6), 1e-6)
    assert eps == pytest.approx(1.0, abs=1e-3)
    # Ten pure 0.1 events: PLD is never worse than basic composition (1.0).
    ten = accounting.compose([accounting.pure_epsilon_event(0.1)] * 10)
    assert accounting.epsilon(ten, 1e-5) <= 1.0 + 1e-3
    # RDP goes through zCDP (rho = 10 * 0.1^2 / 2 = 0.05); dp-accounting's RDP-to-DP
    # conversion is at least as tight as rho + 2 sqrt(rho ln(1/delta)) (Bun & Steinke 2016).
    rdp = accounting.epsilon(ten, 1e-5, accountant="rdp")
    assert 0.5 < rdp <= 0.05 + 2 * math.sqrt(0.05 * math.log(1e5))
    with pytest.raises(UnsupportedEventError):
        accounting.epsilon(accounting.epsilon_delta_event(1.0, 1e-6), 1e-5, accountant="rdp")


def test_event_json_round_trip():
    event = accounting.compose(
        [
            accounting.dpsgd_event(noise_multiplier=1.0, num_examples=100, batch_size=10, steps=5),
            accounting.dpsgd_event(
                noise_multiplier=1.0,
                num_examples=100,
                batch_size=10,
                steps=5,
                sampling="shuffle",
                accountant="rdp",
            ),
            accounting.epsilon_delta_event(0.5, 1e-7),
            accounting.pure_epsilon_event(0.5),
            accounting.pure_epsilon_event(0.5),
        ]
    )
    text = accounting.event_to_json(event)
    assert accounting.event_from_json(text) == event
    assert accounting.event_to_json(accounting.event_from_json(text)) == text


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="batch_size"):
        accounting.dpsgd_event(noise_multiplier=1, num_examples=10, batch_size=20, steps=1)
    with pytest.raises(ValueError, match="delta"):
        accounting.epsilon(accounting.gaussian_event(1.0), 0.0)
    with pytest.raises(ValueError, match="target_epsilon"):
        accounting.calibrate_noise_multiplier(
            target_epsilon=0, delta=1e-5, num_examples=10, batch_size=2, steps=3
        )
    with pytest.raises(ValueError, match="sampling"):
        accounting.neighboring_relation("bogus")
