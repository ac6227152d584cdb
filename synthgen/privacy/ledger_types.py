"""Privacy ledger types: scopes, charges, spends, recompositions, the event-shape error.

The ledger itself is `ledger.PrivacyLedger`; `COLLECTION` is the tenant of a dataset's
collection scope and `LEDGER_ACCOUNTANTS` the accountants a scope may use.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from synthgen.privacy import events
from synthgen.privacy.errors import PrivacyError

LedgerAccountant = Literal["pld", "rdp", "basic"]
LEDGER_ACCOUNTANTS = ("pld", "rdp", "basic")
COLLECTION = "*"  # reserved tenant of a dataset's collection scope (all tenants together)


class EventShapeError(PrivacyError):
    """A scope records another event shape than the one a caller would charge.

    Attributes:
      tenant: the scope's tenant.
      dataset: the scope's dataset.
      recorded: the shape the scope records (public).
      requested: the caller's shape (public).
    """

    def __init__(self, tenant: str, dataset: str, recorded: str, requested: str) -> None:
        who = (
            f"the collection cap of {dataset}" if tenant == COLLECTION else f"({tenant}, {dataset})"
        )
        super().__init__(
            f"{who} records another event shape: every repeated release of a scope must be "
            "the same event (adaptively chosen events void the ledger's composition)"
        )
        self.tenant, self.dataset = tenant, dataset
        self.recorded, self.requested = recorded, requested


@dataclasses.dataclass(frozen=True)
class Scope:
    """Who spends (tenant) on which private data (dataset), with its cap and accountant.

    `relation` takes a `NeighboringRelation` or its name (as `PrivacyLedger.charge` does,
    e.g. a plan's `relation`) and holds the name.
    """

    tenant: str
    dataset: str
    epsilon_cap: float
    delta_cap: float
    accountant: LedgerAccountant = "pld"
    relation: str = "ADD_OR_REMOVE_ONE"

    def __post_init__(self) -> None:
        if isinstance(self.relation, events.NeighboringRelation):
            object.__setattr__(self, "relation", self.relation.name)
        if not self.tenant or not self.dataset:
            raise ValueError(f"tenant and dataset must be non-empty, got {self.tenant=!r}")
        if not (math.isfinite(self.epsilon_cap) and self.epsilon_cap > 0):
            raise ValueError(f"epsilon_cap must be positive, got {self.epsilon_cap=}")
        if not 0 < self.delta_cap < 1:
            raise ValueError(f"delta_cap must be in (0, 1), got {self.delta_cap=}")
        if self.accountant not in LEDGER_ACCOUNTANTS:
            raise ValueError(
                f"accountant must be one of {LEDGER_ACCOUNTANTS}, got {self.accountant=}"
            )
        if self.relation not in events.NeighboringRelation.__members__:
            raise ValueError(f"unknown neighbouring relation {self.relation=}")
        if self.tenant == COLLECTION and self.accountant == "basic":
            # a tenant's standalone figures are stated in its own relation and delta: the
            # collection composes events, never sums figures
            raise ValueError("a collection scope composes events: use the pld or rdp accountant")

    @property
    def is_collection(self) -> bool:
        """Whether this is a dataset's collection scope (every tenant's charges)."""
        return self.tenant == COLLECTION


@dataclasses.dataclass(frozen=True)
class Charge:
    """One recorded spend."""

    id: int
    tenant: str
    dataset: str
    stage: str
    epsilon: float
    delta: float
    event: str
    description: str
    created_at: float
    relation: str = "ADD_OR_REMOVE_ONE"
    ref: str | None = None


@dataclasses.dataclass(frozen=True)
class Spend:
    """Spent and remaining budget of a scope.

    Under ``pld``/``rdp`` the spend is the statement (epsilon, delta_cap) of the composition,
    so `delta` is the cap and `delta_remaining` is None; under ``basic`` both are sums.
    """

    epsilon: float
    delta: float
    epsilon_remaining: float
    delta_remaining: float | None
    num_charges: int


@dataclasses.dataclass(frozen=True)
class Recomposition:
    """A scope's spend recomputed from its recorded events alone (see `verify`).

    Attributes:
      stated: what the running summary states (epsilon at the delta cap; ``basic``: sum).
      pld: dp-accounting's PLD composition of every recorded event (inf: not composable).
      rdp: dp-accounting's RDP composition (inf: not composable).
      num_charges: recorded charges.
    """

    stated: float
    pld: float
    rdp: float
    num_charges: int

    @property
    def best(self) -> float:
        """The tighter of the two recompositions."""
        return min(self.pld, self.rdp)
