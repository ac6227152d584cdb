"""`synthgen ledger show|documents|verify|copy`: inspect and copy the privacy budget ledger."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dpsynth.cli.shared import group_app
from synthgen.command_line import JsonFlagOption
from synthgen.paths import default_ledger_help, default_ledger_path
from synthgen.privacy.figures import format_epsilon, format_remaining

if TYPE_CHECKING:  # the ledger loads dp_accounting: imported by the commands that open one
    from synthgen.privacy.document_filters import DocumentFilters
    from synthgen.privacy.ledger import PrivacyLedger

ledger_app = group_app("Inspect the privacy budget ledger.")


def _existing(location: str) -> str:
    """`location` (path or URL) of a ledger; a missing file is an error."""
    if "://" not in location and not Path(location).exists():
        raise FileNotFoundError(f"no ledger at {location}")
    return location


def _open_ledger(db: str | None) -> PrivacyLedger:
    """The ledger at `db` (path or URL; default $DPSYNTH_LEDGER); a missing file is an error."""
    from synthgen.privacy.ledger import PrivacyLedger

    return PrivacyLedger(_existing(db or str(default_ledger_path())))


LedgerOption = Annotated[
    str | None,
    typer.Option(
        help=f"ledger: file path, sqlite:///path or postgresql://... ({default_ledger_help()})"
    ),
]


@ledger_app.command("show")
def ledger_show(db: LedgerOption = None, as_json: JsonFlagOption = False) -> None:
    """Spent and remaining budget of every scope, and the names that guard the same documents.

    The spend is the ledger's stated figure (`PrivacyLedger.spent`), written as everywhere
    else (`format_epsilon`: 4 decimals rounded up; ``--json`` also has the float). Collection
    names bound to the same documents (`synthgen.privacy.ledger_documents`) are printed
    together with the composition of all their charges: what those documents have lost.
    """
    ledger = _open_ledger(db)
    rows = []
    for scope in ledger.scopes():
        spend = ledger.spent(scope.tenant, scope.dataset)
        rows.append(
            {
                "tenant": scope.tenant,
                "dataset": scope.dataset,
                "accountant": scope.accountant,
                "relation": scope.relation,
                "epsilon_cap": scope.epsilon_cap,
                "delta_cap": scope.delta_cap,
                "epsilon_spent": spend.epsilon,
                "epsilon_spent_text": format_epsilon(spend.epsilon),
                "epsilon_remaining": spend.epsilon_remaining,
                "epsilon_remaining_text": format_remaining(scope.epsilon_cap, spend.epsilon),
                "charges": spend.num_charges,
            }
        )
    groups = [g.to_json() for g in ledger.document_groups()]
    if as_json:
        print(json.dumps(rows + groups, indent=1))
        return
    for r in rows:
        print(
            f"{r['tenant']}/{r['dataset']}: epsilon {r['epsilon_spent_text']} of "
            f"{r['epsilon_cap']:g} spent at delta={r['delta_cap']:g} ({r['accountant']}, "
            f"{r['relation']}, {r['charges']} charges)"
        )
    from synthgen.privacy.document_filters import DocumentFilters

    filters = DocumentFilters(ledger.store)
    for dataset in filters.datasets():
        print(_documents_line(filters, dataset))
    for g in groups:
        print(g["line"])


def _documents_line(filters: DocumentFilters, dataset: str) -> str:
    record, s = filters.get(dataset), filters.summary(dataset)
    return (
        f"{dataset} (individual accounting, per document epsilon {record.budget.epsilon:g} at "
        f"delta={s['delta']:g}): {s['documents']} documents, {s['active']} active, "
        f"{s['exhausted']} exhausted; epsilon spent per document max "
        f"{format_epsilon(s['max_epsilon'])}, median {format_epsilon(s['median_epsilon'])}, "
        f"mean {format_epsilon(s['mean_epsilon'])}"
    )


@ledger_app.command("documents")
def ledger_documents(
    dataset: Annotated[str, typer.Option(help="a collection in individual accounting")],
    db: LedgerOption = None,
    as_json: JsonFlagOption = False,
) -> None:
    """Per-document accounting of a collection: documents, active, exhausted, and the max,
    median and mean epsilon the documents have spent at the document delta.

    Aggregates only: which documents are exhausted depends on the private data.
    """
    from synthgen.privacy.document_filters import DocumentFilters

    filters = DocumentFilters(_open_ledger(db).store)
    if filters.get(dataset) is None:
        raise typer.BadParameter(
            f"collection {dataset!r} is not in individual accounting in this ledger",
            param_hint="--dataset",
        )
    if as_json:
        print(json.dumps(filters.summary(dataset)))
        return
    print(_documents_line(filters, dataset))


@ledger_app.command("verify")
def ledger_verify(db: LedgerOption = None) -> None:
    """Recomposes every scope from its recorded events and compares with the stated spend."""
    ledger = _open_ledger(db)
    failed = 0
    for scope in ledger.scopes():
        check = ledger.verify(scope.tenant, scope.dataset)
        sound = check.stated >= check.best * (1 - 1e-9)
        failed += not sound
        stated = format_epsilon(check.stated)
        print(
            f"{scope.tenant}/{scope.dataset}: stated {stated}, recomposed PLD "
            f"{check.pld:.4f}, RDP {check.rdp:.4f} ({check.num_charges} charges) "
            f"{'ok' if sound else 'BELOW THE RECOMPOSITION'}"
        )
    if failed:
        raise typer.Exit(1)


@ledger_app.command("copy")
def ledger_copy(
    source: Annotated[str, typer.Option("--from", help="ledger to read (path or URL)")],
    target: Annotated[str, typer.Option("--to", help="new ledger to write (path or URL)")],
) -> None:
    """Copies a ledger to another backend, checked charge by charge."""
    from synthgen.privacy.ledger_copy import copy_ledger

    report = copy_ledger(_existing(source), target)
    print(f"copied {report.scopes} scopes and {report.charges} charges; checked charge by charge")
