"""Privacy accounting, one import: re-exports events, accountants, DP-SGD and few-shot.

This module defines nothing. It re-exports the public names of the modules that hold
them, so that callers keep writing ``accounting.<name>`` after
``from synthgen.privacy import accounting``:

  * `events`: event types, event builders, validation, neighbouring relations, JSON;
  * `accountants`: the PLD and RDP accountants, `epsilon`;
  * `dpsgd_accounting`: DP-SGD's event, epsilon and noise calibration;
  * `fewshot_accounting`: DP few-shot generation's event, epsilon and calibration.

The API reference documents each name in its own module. Modules inside `synthgen.privacy`
import from those modules, never from this one.
"""

from synthgen.privacy.accountants import (  # noqa: F401
    ACCOUNTANTS,
    MIN_NOISE_MULTIPLIER,
    AccountantKind,
    PldAccountant,
    RdpAccountant,
    bounded_range_pld,
    epsilon,
    make_accountant,
)
from synthgen.privacy.dpsgd_accounting import (  # noqa: F401
    SAMPLINGS,
    Sampling,
    calibrate_noise_multiplier,
    dpsgd_epsilon,
    dpsgd_event,
    neighboring_relation,
    steps_for_epochs,
)
from synthgen.privacy.events import (  # noqa: F401
    BoundedRangeDpEvent,
    EpsilonDeltaDpEvent,
    FixedSizeSampledGaussianDpEvent,
    NeighboringRelation,
    as_relation,
    bounded_range_event,
    check_delta,
    compose,
    convert_relation,
    epsilon_delta_event,
    event_from_json,
    event_to_json,
    gaussian_event,
    laplace_event,
    poisson_sampled,
    pure_epsilon_event,
    restate_legacy,
    self_composed,
    validate_event,
)
from synthgen.privacy.fewshot_accounting import (  # noqa: F401
    FEWSHOT_MECHANISMS,
    FEWSHOT_RESAMPLING,
    amplified_pure_epsilon,
    calibrate_fewshot,
    fewshot_epsilon,
    fewshot_event,
)
