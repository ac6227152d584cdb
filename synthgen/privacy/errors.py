"""Error types of the privacy core."""


class PrivacyError(Exception):
    """Base class for errors raised by the privacy core."""


class BudgetExceededError(PrivacyError):
    """A charge would take a scope past its privacy budget; nothing was recorded."""


class UnsupportedEventError(PrivacyError):
    """The chosen accountant cannot account for this event."""


class RelationMismatchError(PrivacyError):
    """An event's neighbouring relation differs from its scope's and cannot be converted."""
