"""Error types of the privacy core."""


class PrivacyError(Exception):
    """Base class for errors raised by the privacy core."""


class BudgetExceededError(PrivacyError):
    """A charge would take a scope past its privacy budget; nothing was recorded."""


class UnsupportedEventError(PrivacyError):
    """The chosen accountant cannot account for this event."""
