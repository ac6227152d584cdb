"""Privacy core: mechanisms, accounting and the budget ledger.

Every DP release of the project goes through this package, so one ledger and one accountant
state the guarantee of a whole pipeline. It imports nothing from the rest of the project.
"""

from synthgen.privacy.accountants import epsilon, make_accountant
from synthgen.privacy.dpsgd_accounting import (
    calibrate_noise_multiplier,
    dpsgd_epsilon,
    dpsgd_event,
    neighboring_relation,
    steps_for_epochs,
)
from synthgen.privacy.errors import BudgetExceededError, PrivacyError, UnsupportedEventError
from synthgen.privacy.events import (
    EpsilonDeltaDpEvent,
    compose,
    epsilon_delta_event,
    event_from_json,
    event_to_json,
    gaussian_event,
    laplace_event,
    poisson_sampled,
    pure_epsilon_event,
    self_composed,
)
from synthgen.privacy.figures import format_epsilon, format_left, format_remaining
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.ledger_types import COLLECTION, Charge, Scope, Spend
from synthgen.privacy.mechanisms import (
    AboveThreshold,
    exponential_mechanism,
    gaussian_mechanism,
    laplace_mechanism,
    limited_domain_top1,
    report_noisy_max,
    sparse_vector,
)
from synthgen.privacy.rng import secure_rng

__all__ = [
    "AboveThreshold",
    "BudgetExceededError",
    "COLLECTION",
    "Charge",
    "EpsilonDeltaDpEvent",
    "PrivacyError",
    "PrivacyLedger",
    "Scope",
    "Spend",
    "UnsupportedEventError",
    "calibrate_noise_multiplier",
    "compose",
    "dpsgd_epsilon",
    "dpsgd_event",
    "epsilon",
    "epsilon_delta_event",
    "event_from_json",
    "event_to_json",
    "exponential_mechanism",
    "format_epsilon",
    "format_left",
    "format_remaining",
    "gaussian_event",
    "gaussian_mechanism",
    "laplace_event",
    "laplace_mechanism",
    "limited_domain_top1",
    "make_accountant",
    "neighboring_relation",
    "poisson_sampled",
    "pure_epsilon_event",
    "report_noisy_max",
    "secure_rng",
    "self_composed",
    "sparse_vector",
    "steps_for_epochs",
]
