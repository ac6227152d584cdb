"""Privacy accounting, one import: re-exports events, accountants, DP-SGD and few-shot.

Defines nothing: callers write ``accounting.<name>`` after ``from synthgen.privacy import
accounting``; each name is documented in its own module (`events`, `accountants`,
`dpsgd_accounting`, `fewshot_accounting`). Modules inside `synthgen.privacy` import from
those modules, never from this one.
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
