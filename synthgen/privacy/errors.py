"""Error types of the privacy core."""


class PrivacyError(Exception):
    """Base class for errors raised by the privacy core."""


class BudgetExceededError(PrivacyError):
    """A charge would take a scope past its privacy budget; nothing was recorded.

    Attributes:
      tenant: the refusing scope's tenant (``"*"``: the dataset's collection cap).
      dataset: the refusing scope's dataset.
    """

    def __init__(self, message: str = "", *, tenant: str | None = None, dataset: str | None = None):
        super().__init__(message)
        self.tenant, self.dataset = tenant, dataset


class UnsupportedEventError(PrivacyError):
    """The chosen accountant cannot account for this event."""


class RelationMismatchError(PrivacyError):
    """An event's neighbouring relation differs from its scope's and cannot be converted."""
