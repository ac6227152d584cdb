"""Admission: the one path by which a release of a private collection meets the ledger.

Before any compute that reads private records, `admit`

1. binds the records to the collection's name (`PrivacyLedger.bind_documents`: another
   name over documents already charged is refused unless the user says the guarantees add
   up), so a renamed file is not a fresh budget;
2. opens the (tenant, collection) scope if it is new, with the cap the user gave or the
   plan's own epsilon, the plan's delta and the plan's neighbouring relation;
3. checks the plan's event against every cap (a dry run of the charge: nothing recorded;
   a resumable run checks through its work folder instead, which knows its own charge);
4. tells the user which ledger holds the charge and whether the guarantee is weak.

The charge itself comes later, from the algorithm's run (once, before its first noise).

Privacy:
  Reads the records only to bind them (keyed digests kept in the ledger); states nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from synthgen.privacy import notices
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.ledger_documents import bind_texts
from synthgen.privacy.ledger_types import Scope
from synthgen.privacy.release_plan import ReleasePlan


def admit(
    ledger: PrivacyLedger,
    tenant: str,
    dataset: str,
    records: Sequence[str | Mapping],
    plan: ReleasePlan,
    *,
    stage: str,
    public_count: int,
    budget: float | None = None,
    delta: float | None = None,
    guarantees_add_up: bool = False,
    check: bool = True,
    open_scope: Callable[[PrivacyLedger, Scope], object] | None = None,
    tell: Callable[[Iterable[str]], None] = notices.tell,
    option: str | None = "--ledger",
) -> tuple[str, str]:
    """Admits a release of `records` (the collection `dataset`) under `plan` (module docstring).

    Args:
      ledger, tenant, dataset: where the release is charged.
      records: the private records the release reads (texts or rows), bound to `dataset`.
      plan: the release's plan: its event is checked under its relation.
      stage: the stage name the charge will carry.
      public_count: the n the delta warning compares with (a declared, public figure where
        the plan uses one; never a count the release would otherwise hide).
      budget: the scope's epsilon cap if it is new (default: the plan's epsilon, at least
        1e-6: a scope needs a positive cap, and a very noisy run may state epsilon 0).
      delta: the scope's delta cap, the delta the notices read (default: the plan's; the
        main job's few-shot run keeps the larger of the configured delta and the plan's).
      guarantees_add_up: bind documents that other names have charged (their totals add).
      check: dry-run the charge here. False only for a resumable run that checks itself
        through its work folder, which knows a resumed run's charge is already there
        (`WorkFolder.check_budget`): a check here would count that charge twice.
      open_scope: how the scope is opened (default `PrivacyLedger.ensure_scope`: an
        existing scope keeps its cap; the main job refuses other caps instead).
      tell: where the notices go (default: printed on stderr; the main job logs them).
      option: the command-line option that names the ledger, for the new-ledger warning.

    Returns:
      (tenant, dataset): the scope the release is charged to.

    Raises:
      SharedDocumentsError: other names guard these documents.
      BudgetExceededError: the plan's event does not fit a cap.
    """
    bind_texts(ledger, dataset, list(records), guarantees_add_up=guarantees_add_up)
    cap = budget if budget is not None else max(plan.epsilon, 1e-6)
    delta = plan.delta if delta is None else delta
    scope = Scope(tenant, dataset, cap, delta, relation=plan.relation)
    if open_scope is None:
        ledger.ensure_scope(scope)
    else:
        open_scope(ledger, scope)
    if check:
        ledger.check(tenant, dataset, stage=stage, event=plan.event, relation=plan.relation)
    tell(
        notices.ledger_lines(ledger, dataset, option=option)
        + notices.guarantee_lines(plan.epsilon, delta, public_count)
    )
    return tenant, dataset
