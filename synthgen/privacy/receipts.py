"""Receipts: an algorithm is paid for before it draws noise, and never holds the ledger.

The caller that admitted the data (`synthgen.privacy.admission`) hands the algorithm a
*payer* (`ledger_payer` over its ledger and scope): ``pay.check(plan)`` dry-runs the
charge, and ``pay(plan, description)`` makes it and returns a `Receipt`. The algorithm runs
its public checks, pays once, checks that the receipt is for its own plan's event
(`paid`), and only then draws noise. So the algorithm cannot charge another scope, and
cannot draw noise for an event the ledger never saw: "charge, then noise" is one call.

Privacy:
  A receipt holds public figures only: the scope's names, the stage, the charged event's
  JSON and the charge's id.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from synthgen.privacy.document_filters import DocumentFilters
from synthgen.privacy.events import as_relation, event_to_json
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.ledger_types import Charge
from synthgen.privacy.release_plan import ReleasePlan


@dataclasses.dataclass(frozen=True)
class Receipt:
    """What the ledger recorded for one release: its scope, stage, event and charge id."""

    tenant: str
    dataset: str
    stage: str
    event: str  # the charged DpEvent as the ledger stored it (`event_to_json`)
    charge_id: int
    relation: str = "ADD_OR_REMOVE_ONE"  # the relation the ledger stored it under

    @classmethod
    def of(cls, charge: Charge) -> Receipt:
        """The receipt of a charge the ledger recorded (its stored event and relation)."""
        return cls(
            charge.tenant, charge.dataset, charge.stage, charge.event, charge.id, charge.relation
        )

    @property
    def scope(self) -> tuple[str, str]:
        return self.tenant, self.dataset

    def check(self, plan: ReleasePlan) -> None:
        """Raises ValueError unless this receipt charged `plan`'s event under its relation."""
        if (
            self.event != event_to_json(plan.event)
            or self.relation != as_relation(plan.relation).name
        ):
            raise ValueError(
                f"the receipt for {self.stage} charged another event than this plan's: no "
                "noise is drawn for a release the ledger was not charged for"
            )


class Payer(Protocol):
    """What an algorithm is handed instead of the ledger."""

    scope: tuple[str, str]  # the (tenant, dataset) it charges: public, stated in releases

    def check(self, plan: ReleasePlan) -> None:
        """A dry run of the charge: raises as the charge would, records nothing."""

    def __call__(self, plan: ReleasePlan, description: str, ref: str | None = None) -> Receipt:
        """Charges `plan.event` under `plan.relation`; returns the receipt. `ref`: an
        idempotency key (a public random id): a second call with it returns the first
        charge's receipt and charges nothing."""


@dataclasses.dataclass(frozen=True)
class LedgerPayer:
    """A payer over `scope` of `ledger` at `stage` (`PrivacyLedger.check` and
    `PrivacyLedger.charge`: a charge over a cap is refused, and nothing is recorded then)."""

    ledger: PrivacyLedger
    scope: tuple[str, str]
    stage: str

    def check(self, plan: ReleasePlan) -> None:
        self.ledger.check(*self.scope, stage=self.stage, event=plan.event, relation=plan.relation)

    def __call__(self, plan: ReleasePlan, description: str, ref: str | None = None) -> Receipt:
        charge = self.ledger.charge(
            *self.scope,
            stage=self.stage,
            event=plan.event,
            relation=plan.relation,
            description=description,
            ref=ref,
        )
        return Receipt.of(charge)


def ledger_payer(ledger: PrivacyLedger, scope: tuple[str, str], *, stage: str) -> LedgerPayer:
    """The payer of `scope` in `ledger` for releases at `stage`."""
    return LedgerPayer(ledger, tuple(scope), stage)


def paid(
    pay: Payer | None, plan: ReleasePlan, description: str, ref: str | None = None
) -> Receipt | None:
    """``pay(plan, description)``, its receipt checked against `plan` (what an algorithm
    calls once, after its public checks and before its first noise); None without a payer
    (an uncharged run). `ref`: the charge's idempotency key, for a release that keeps its
    own (`synthgen.knowledge.facts`)."""
    if pay is None:
        return None
    receipt = pay(plan, description) if ref is None else pay(plan, description, ref=ref)
    receipt.check(plan)
    return receipt


@dataclasses.dataclass(frozen=True)
class CollectionPayer:
    """A payer over one collection for the tenants that ask it (DP-RAG's answers).

    An answer is charged to the tenant that asked, all its stages in one ledger
    transaction (and, for a collection with per-document filters, each paying document's
    loss in the same transaction: `PrivacyLedger.charge_all`). It reads and charges
    `dataset` only: the answer stage is handed this, never the ledger.
    """

    _ledger: PrivacyLedger = dataclasses.field(repr=False)
    dataset: str

    def check(self, tenant: str, *, stage: str, event, relation, delta: float) -> None:
        """A dry run of an answer's charge to `tenant` (raises as the charge would)."""
        self._ledger.check(
            tenant, self.dataset, stage=stage, event=event, relation=relation, delta=delta
        )

    def charge_all(
        self, tenant: str, items, *, relation, delta, ref, documents=None, event_shape=None
    ):
        """`PrivacyLedger.charge_all` on (`tenant`, this collection): every stage of one
        answer, atomically; returns the recorded charges."""
        return self._ledger.charge_all(
            tenant, self.dataset, items, relation=relation, delta=delta, ref=ref,
            documents=documents, event_shape=event_shape,
        )  # fmt: skip

    def remaining(self, tenant: str) -> float:
        """The tenant's epsilon left on this collection."""
        return self._ledger.spent(tenant, self.dataset).epsilon_remaining

    def document_filter(self):
        """The collection's per-document filter record (None: collection accounting)."""
        return DocumentFilters(self._ledger.store).get(self.dataset)

    def exhausted_in(self, conn, rho: float) -> list[str]:
        """Inside a charge's transaction: the documents a charge of `rho` would exhaust."""
        return DocumentFilters(self._ledger.store).exhausted_in(conn, self.dataset, rho)

    def exhausted_count(self) -> int:
        """How many of the collection's documents are exhausted (an aggregate)."""
        return DocumentFilters(self._ledger.store).summary(self.dataset)["exhausted"]

    def has_collection_cap(self) -> bool:
        return self._ledger.collection_scope(self.dataset) is not None


def collection_payer(ledger: PrivacyLedger, dataset: str) -> CollectionPayer:
    """The payer of `dataset`'s answers in `ledger`."""
    if not isinstance(ledger, PrivacyLedger):
        raise ValueError(f"a collection payer needs a PrivacyLedger, got {type(ledger).__name__}")
    return CollectionPayer(ledger, dataset)
