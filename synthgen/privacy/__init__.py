"""Privacy core: mechanisms, accounting and the budget ledger.

Every DP release of the project goes through this package, so one ledger and one accountant
state the guarantee of a whole pipeline. It imports nothing from the rest of the project.

The names below load their module on first use (PEP 562), so that importing one
submodule, such as `synthgen.privacy.errors`, does not load the accountants' libraries.
"""

import importlib

_MODULE_OF = {
    "epsilon": "accountants",
    "make_accountant": "accountants",
    "calibrate_noise_multiplier": "dpsgd_accounting",
    "dpsgd_epsilon": "dpsgd_accounting",
    "dpsgd_event": "dpsgd_accounting",
    "neighboring_relation": "dpsgd_accounting",
    "steps_for_epochs": "dpsgd_accounting",
    "BudgetExceededError": "errors",
    "PrivacyError": "errors",
    "UnsupportedEventError": "errors",
    "EpsilonDeltaDpEvent": "events",
    "compose": "events",
    "epsilon_delta_event": "events",
    "event_from_json": "events",
    "event_to_json": "events",
    "gaussian_event": "events",
    "laplace_event": "events",
    "poisson_sampled": "events",
    "pure_epsilon_event": "events",
    "self_composed": "events",
    "format_epsilon": "figures",
    "format_left": "figures",
    "format_remaining": "figures",
    "PrivacyLedger": "ledger",
    "COLLECTION": "ledger_types",
    "Charge": "ledger_types",
    "Scope": "ledger_types",
    "Spend": "ledger_types",
    "exponential_mechanism": "mechanisms",
    "gaussian_mechanism": "mechanisms",
    "laplace_mechanism": "mechanisms",
    "secure_rng": "rng",
}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
