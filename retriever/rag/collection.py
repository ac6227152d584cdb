"""What answering from a private collection assumes, checked before anything is charged.

`DPRag` is DP for one document (add/remove-one) under assumptions the answer loop cannot
see; `load_dprag`, `retriever answer`, `retriever serve` and the pipeline's rag stage check
them here, before any scope is opened or charged: an encoder independent of the collection
(`check_encoder`; an operator's assertion is noted on the collection cap), δ below 1/n for
the answer and every scope (`check_delta`), one budget per set of documents
(`PrivacyLedger.bind_documents`) and one answer event per collection (`pin_answer_event`:
parameters chosen after seeing answers are adaptive). See docs/guides/dp_rag.md ("What is
checked, and refused in one line") and docs/guides/privacy.md ("One budget per set of
documents").

Privacy:
  Everything here reads public parameters, provenance and counts the operator already
  states (n, the number of documents, as the δ bound needs); no document text, id or score
  enters an error, a log or the ledger.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from retriever.provenance import collection_independence, encoder_provenance, read_provenance
from retriever.rag.plan import RELATION, RETIRED, AnswerPlan, answer_event_shape
from synthgen.privacy import COLLECTION, PrivacyLedger, Scope, accounting
from synthgen.privacy.document_filters import DocumentFilter, DocumentFilters
from synthgen.privacy.individual import DocumentBudget
from synthgen.privacy.ledger_documents import GUARANTEES_FLAG
from synthgen.privacy.ledger_types import EventShapeError

ENCODER_FLAG = "--encoder-independent-of-collection"


def _encoder_label(encoder: str) -> str:
    """How the ledger names an encoder: an asset's name, a folder's last component (no
    path of the operator's machine goes into the ledger)."""
    path = Path(encoder).expanduser()
    return path.resolve().name if path.is_dir() else str(encoder)


def check_encoder(encoder: str, *, asserted: bool = False) -> str | None:
    """Refuses an encoder not known to be independent of the collection it would score.

    Args:
      encoder: the encoder the index was built with (asset, folder).
      asserted: the operator asserts it was not trained on the collection (`ENCODER_FLAG`).

    Returns:
      None when its provenance establishes independence; else, when `asserted`, the line to
      record in the collection cap's notes (`record_encoder_assertion`).

    Raises:
      ValueError: neither the provenance nor the operator establishes it.

    Privacy:
      The answers' sensitivity assumes scores from an encoder fixed independently of the
      collection (one trained on it without DP could encode any document); a DP-trained
      encoder depends on it through its DP release only, and the guarantees compose (Dwork
      and Roth 2014, Thm. 3.16).
    """
    if collection_independence(encoder) is not None:
        return None
    if asserted:
        return (
            f"encoder {_encoder_label(encoder)}: asserted by the operator ({ENCODER_FLAG}) not "
            "to depend on this collection; its provenance does not establish it"
        )
    path = Path(encoder).expanduser()
    if path.is_dir() and read_provenance(path) is None:
        why = "a folder without provenance.json"
    else:
        why = encoder_provenance(encoder)["statement"]
    raise ValueError(
        f"the index's encoder {encoder} is not known to be independent of the private "
        f"collection ({why}); DP-RAG's sensitivity assumes it is: build the index with a "
        f"public pretrained or DP-trained encoder, or pass {ENCODER_FLAG} if it was never "
        "trained on this collection"
    )


def record_encoder_assertion(ledger: PrivacyLedger, dataset: str, line: str) -> None:
    """Records the operator's encoder assertion in the notes of `dataset`'s collection cap.

    Raises:
      ValueError: the dataset has no collection cap (where every answer composes).
    """
    if ledger.collection_scope(dataset) is None:
        raise ValueError(
            f"{ENCODER_FLAG} is recorded on the collection cap of {dataset}, which has none: "
            "open one first (retriever tenant add ... --collection-epsilon E --collection-delta D)"
        )
    ledger.note_scope(COLLECTION, dataset, line)


def _scope_name(scope: Scope) -> str:
    if scope.is_collection:
        return f"the collection cap of {scope.dataset}"
    return f"the scope ({scope.tenant}, {scope.dataset})"


def check_delta(delta: float, documents: int, what: str) -> None:
    """Refuses `delta` >= 1/n for a collection of n = `documents` documents.

    Raises:
      ValueError: one line naming `what`, the bound and n (never a document).
    """
    try:
        accounting.check_delta(delta, documents)
    except ValueError:
        raise ValueError(
            f"{what}: delta must be in (0, 1/n) = (0, {1 / documents:.3g}) for n={documents} "
            f"documents, got {delta:g} (a larger delta permits releasing one document)"
        ) from None


def check_scope_deltas(
    ledger: PrivacyLedger, dataset: str, documents: int, *new: Scope | None
) -> None:
    """Refuses a δ cap >= 1/n among the scopes of `dataset`, stored or `new` (those of
    `dataset` whose tenant has no stored scope yet).

    Raises:
      ValueError: naming the scope, its cap and n.
    """
    scopes = [s for s in ledger.scopes() if s.dataset == dataset]
    stored = {s.tenant for s in scopes}
    scopes += [s for s in new if s is not None and s.dataset == dataset and s.tenant not in stored]
    for scope in scopes:
        check_delta(scope.delta_cap, documents, f"the delta cap of {_scope_name(scope)}")


def refuse_individual_assertion(assertion: str | None) -> None:
    """Refuses an encoder assertion in individual accounting (no collection cap to record
    it on)."""
    if assertion is not None:
        raise ValueError(
            f"{ENCODER_FLAG} is recorded on a collection cap, which individual accounting "
            "does not have: build the index with a public pretrained or DP-trained encoder"
        )


def open_document_filters(
    ledger: PrivacyLedger,
    dataset: str,
    *,
    documents: int,
    epsilon: float,
    delta: float,
    plan: AnswerPlan,
    records: tuple[Sequence[str], Sequence[str]] | None = None,
    check_only: bool = False,
) -> DocumentFilter:
    """Puts `dataset` in individual accounting: each document gets an (epsilon, delta)
    filter (`synthgen.privacy.document_filters`); the same settings again are a no-op.
    `check_only`: every refusal below, nothing written (the record it would open).

    Args:
      ledger, dataset, documents: the privacy ledger, the collection and n, its size.
      records: (doc_ids, texts): the filters pin which record each id names, and refuse
        the same collection under other ids (None: nothing pinned, e.g. a throwaway ledger).
      epsilon, delta: each document's target over every answer of every tenant.
      plan: the default answer's plan; its `document_rho` is the collection's public
        per-answer charge (what "exhausted" means in the summary).

    Raises:
      ValueError: the collection has a collection cap or charges recorded before its
        filters, a delta of 1/n or more, a plan without a zCDP curve or costing more than
        a whole filter, or filters with other settings.

    Privacy:
      Individual Rényi filter (Feldman & Zrnic 2021): every document of the collection is
      (epsilon, delta)-DP over everything any tenant asked, however adaptively; tenant
      scopes become quotas.
    """
    if ledger.collection_scope(dataset) is not None:
        raise ValueError(
            f"{dataset} has a collection cap, which composes every answer; per-document "
            "accounting replaces it: use another collection name"
        )
    check_delta(delta, documents, "the per-document delta")
    filters = DocumentFilters(ledger.store)
    if filters.get(dataset) is None:
        charged = [
            s for s in ledger.scopes() if s.dataset == dataset and ledger.charges(s.tenant, dataset)
        ]
        if charged:  # earlier answers are in no document's loss: the statement would omit them
            raise ValueError(
                f"{dataset} already has charges in {len(charged)} scope(s) under collection "
                "accounting; per-document filters opened now would leave those answers out: "
                "use another collection name"
            )
    pinned = None if records is None else ledger.records_under_ids(*records, read_only=check_only)
    record = DocumentFilter(
        dataset, DocumentBudget(epsilon, delta), plan.document_rho(), documents, pinned
    )
    if check_only:
        filters.check(record)
        return record
    return filters.open(record)


def open_answer_scopes(
    ledger: PrivacyLedger, tenant: Scope, *, documents: int, collection: Scope | None = None
) -> None:
    """Opens `tenant`'s scope (an existing one keeps its caps) and, if the dataset has
    none, the `collection` cap, after checking every δ cap, stored or new, below 1/n for
    n = `documents`.

    Without a collection cap (stored or `collection`) a tenant scope would be a fresh
    budget per tenant name, nothing bounding them together: it is required unless the
    collection is in individual accounting (`open_document_filters`), where the tenant's
    scope is a quota.

    Raises:
      ValueError: no collection cap, or a δ cap (stored or new) >= 1/n.
    """
    dataset = tenant.dataset
    stored = ledger.collection_scope(dataset)
    individual = DocumentFilters(ledger.store).get(dataset) is not None
    if individual and collection is not None:
        raise ValueError(
            f"{dataset} has per-document filters: it takes no collection cap "
            "(drop --collection-epsilon / --collection-delta)"
        )
    if stored is None and collection is None and not individual:
        raise ValueError(
            f"{dataset} has no collection cap (all tenants together): pass "
            "--collection-epsilon and --collection-delta to open one"
        )
    check_scope_deltas(ledger, dataset, documents, collection, tenant)
    if stored is None and collection is not None:
        ledger.ensure_scope(collection)
    ledger.ensure_scope(tenant)


# set by the mechanism: when the mechanism differs, naming them too only confuses
_DERIVED = ("composition", "retrieval_share")
# set by the mechanism and max_tokens (icl: max_tokens; keywords and facts: 1): never named
_IMPLIED = ("max_releases",)


def _differing(recorded: str, requested: str) -> list[tuple[str, object, object]] | None:
    """(field, recorded, requested) of the fields that differ, the implied ones left out and
    the mechanism's own fields too when the mechanism differs; None: not a shape this
    program wrote (unreadable, or only an implied field differs)."""
    try:
        old, new = json.loads(recorded), json.loads(requested)
    except json.JSONDecodeError:
        return None
    keys = sorted(set(old) | set(new))
    if old.get("mechanism") != new.get("mechanism"):
        keys = [k for k in keys if k not in _DERIVED]
    differing = [(k, old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)]
    shown = [d for d in differing if d[0] not in _IMPLIED]
    return None if differing and not shown else shown


def _shown(value: object) -> str:
    return "unset" if value is None else str(value)


# the options that set each field of an answer's event shape; every option named here is
# one that `retriever answer` or `retriever serve` accepts (tested)
_SHAPE_OPTIONS = {
    "epsilon": "--answer-epsilon (serve) / --epsilon (answer)",
    "mechanism": "--mechanism",
    "delta": "--delta",
    "max_tokens": "--max-tokens",
    "composition": "--composition",
    "retrieval_share": "the mechanism's retrieval share (--mechanism)",
    "score_share": "--score (answer)",
}
# how to answer at another event: a new name whose guarantee adds up with the old one's
_NEW_NAME = (
    f"--dataset NEW {GUARANTEES_FLAG} and its own caps (`retriever tenant add NAME --dataset "
    "NEW --collection-epsilon E --collection-delta D`)"
)


def _retired_mechanism(recorded: str) -> str | None:
    """The retired mechanism (`plan.RETIRED`) a recorded shape names, if any."""
    try:
        mechanism = json.loads(recorded).get("mechanism")
    except (json.JSONDecodeError, AttributeError):
        return None
    return mechanism if mechanism in RETIRED else None


def _shape_refusal(
    dataset: str, recorded: str, requested: str, restore: str | None = None
) -> ValueError:
    """The refusal of `requested` where `recorded` is pinned; `restore`: the caller's own
    way forward (the main job names its config keys), else the command-line options'."""
    adds_up = f"whose guarantee then adds up with {dataset}'s (the ledger totals both)"
    retired = _retired_mechanism(recorded)
    if retired is not None:  # its recorded settings cannot be used again: say so
        return ValueError(
            f"the collection {dataset} was pinned to {retired}, which was retired: its "
            "charges still compose in the ledger, but no answer can be given at that event "
            "any more. To answer from these documents (facts, keywords or icl), use another "
            f"collection name, {adds_up}: {_NEW_NAME}"
        )
    differing = _differing(recorded, requested)
    if differing is None:
        what = "recorded by another program"
        forward = "answer with the recorded settings (`retriever tenant list` shows them)"
    else:
        what = "; ".join(
            f"{k} {_shown(old)} recorded, {_shown(new)} here" for k, old, new in differing
        )
        settings = ", ".join(f"{_SHAPE_OPTIONS.get(k, k)} {_shown(old)}" for k, old, _ in differing)
        forward = (
            f"to go on, use the recorded settings ({settings}). Other settings need another "
            f"collection name over the same documents, {adds_up}: only deliberately, with "
            f"{_NEW_NAME}"
        )
    return ValueError(
        f"{dataset} already answers with another event ({what}): every answer charged to a "
        "collection must be the same event (adaptively chosen events void the ledger's "
        f"composition); {restore or forward}"
    )


def check_answer_event(
    ledger: PrivacyLedger, dataset: str, plan: AnswerPlan, *, restore: str | None = None
) -> None:
    """Read-only: refuses a plan whose shape differs from the one `dataset` pinned, or,
    where none is pinned, from the answers already charged (`_check_unpinned_answers`); to
    refuse before loading anything heavy (`pin_answer_event` decides atomically). `restore`:
    the way forward the refusal names (default: the command-line options)."""
    recorded = None
    if ledger.collection_scope(dataset) is not None:
        recorded = ledger.event_shape(COLLECTION, dataset)
    if recorded is None:
        _check_unpinned_answers(ledger, dataset, plan, restore)
    elif recorded != answer_event_shape(plan):
        raise _shape_refusal(dataset, recorded, answer_event_shape(plan), restore)


def _check_unpinned_answers(
    ledger: PrivacyLedger, dataset: str, plan: AnswerPlan, restore: str | None
) -> None:
    """Refuses to pin `plan` over answers charged to `dataset` before any event was pinned
    (a ledger of a version that pinned none) unless each of their stage charges is one of
    `plan`'s (`stage_events`, as `DPRag` charges them): the pin would otherwise admit
    answers at another event than those already given. Other stages (a release, an audit)
    are not answers and are left out."""
    from synthgen.privacy.events import event_to_json

    charged = {(c.stage, c.event) for c in ledger.charges(COLLECTION, dataset)}
    answers = {(stage, event) for stage, event in charged if stage.startswith("rag-")}
    if not answers <= {(f"rag-{s}", event_to_json(e)) for s, e in plan.stage_events()}:
        forward = restore or f"use another collection name, {_NEW_NAME}"
        raise ValueError(
            f"{dataset} holds answers charged at another event than this one, before answer "
            f"events were pinned: the ledger cannot show that every answer is the same event; "
            f"{forward}"
        )


def pin_answer_event(
    ledger: PrivacyLedger, dataset: str, plan: AnswerPlan, *, restore: str | None = None
) -> None:
    """Pins `plan`'s event shape on `dataset`'s collection cap, or checks the pinned one
    (`restore` as in `check_answer_event`).

    Raises:
      ValueError: no collection cap, or another shape pinned (nothing changes).
    """
    if ledger.collection_scope(dataset) is None:
        raise ValueError(f"{dataset} has no collection cap to record its answer event on")
    if ledger.event_shape(COLLECTION, dataset) is None:
        _check_unpinned_answers(ledger, dataset, plan, restore)
    shape = answer_event_shape(plan)
    try:
        ledger.pin_event_shape(COLLECTION, dataset, shape)
    except EventShapeError as exc:
        raise _shape_refusal(dataset, exc.recorded, shape, restore) from None


@dataclasses.dataclass(frozen=True)
class PrivateCollection:
    """A private collection as an answer's checks see it, built once per command.

    Attributes:
      name: its name in the ledger (``--dataset``).
      documents: n, its number of documents (every δ bound needs it).
      cap: the collection cap to open if the ledger has none (None: it must have one,
        or be in individual accounting).
    """

    name: str
    documents: int
    cap: Scope | None = None
    doc_ids: tuple[str, ...] = dataclasses.field(default=(), repr=False, compare=False)
    texts: tuple[str, ...] = dataclasses.field(default=(), repr=False, compare=False)

    @classmethod
    def of(
        cls,
        name: str,
        texts: list[str],
        *,
        doc_ids: list[str] | None = None,
        cap_epsilon: float | None = None,
        cap_delta: float | None = None,
    ) -> PrivateCollection:
        """The collection of `texts` named `name`, with the cap to open if it has none.

        Raises:
          ValueError: only one of `cap_epsilon`, `cap_delta`; no texts.
        """
        if (cap_epsilon is None) != (cap_delta is None):
            raise ValueError("pass both --collection-epsilon and --collection-delta, or neither")
        cap = None if cap_epsilon is None else Scope(COLLECTION, name, cap_epsilon, cap_delta)
        if not texts:
            raise ValueError(f"collection {name} has no documents")
        return cls(name, len(texts), cap, tuple(doc_ids or ()), tuple(texts))

    @classmethod
    def read(cls, corpus: str | Path, name: str, **caps) -> PrivateCollection:
        """The collection of a corpus.jsonl (doc_id, text), read once (`of` for `caps`)."""
        from retriever.data import read_corpus

        doc_ids, texts = read_corpus(corpus)
        return cls.of(name, texts, doc_ids=doc_ids, **caps)

    def admit(
        self,
        ledger: PrivacyLedger,
        tenant: Scope,
        plan: AnswerPlan,
        *,
        document_target: tuple[float, float] | None = None,
        encoder_assertion: str | None = None,
        guarantees_add_up: bool = False,
        room: bool = True,
        restore: str | None = None,
    ) -> None:
        """Every check an answer from this collection needs, then its scopes opened.

        In order: the per-answer δ below 1/n; in individual accounting (`document_target`
        given) no encoder assertion and every δ cap below 1/n, in collection accounting no
        filters and the collection's pinned answer event; the documents bound to the name
        (`PrivacyLedger.bind_documents`, refused over documents other names have charged
        without `guarantees_add_up`); the filters (opened, or checked against the stored
        ones) and scopes opened; with `room`, the answer's worst case checked against every
        cap (False: a resumed run with no answer left to give). `restore`: the way forward
        an event refusal names (`check_answer_event`).

        Raises:
          ValueError: any check above (one line naming the option to change).
          SharedDocumentsError: other names guard these documents.
          BudgetExceededError: the answer's worst case exceeds a cap.
        """
        check_delta(plan.delta, self.documents, "--delta (per answer)")
        filters = None
        if document_target is not None:
            refuse_individual_assertion(encoder_assertion)
            check_scope_deltas(ledger, self.name, self.documents, tenant)
            # refuses a collection cap, a document delta of 1/n or more, an answer costing
            # more than a whole filter and filters with other settings, before writing
            filters = dict(documents=self.documents, plan=plan, epsilon=document_target[0],
                           delta=document_target[1])  # fmt: skip
            if self.doc_ids:  # the filters pin which record each id names
                filters["records"] = (self.doc_ids, self.texts)
            open_document_filters(ledger, self.name, check_only=True, **filters)
        elif DocumentFilters(ledger.store).get(self.name) is not None:
            raise ValueError(
                f"{self.name} is in individual accounting (per-document filters): answer "
                "with --accounting individual and its --document-epsilon / --document-delta"
            )
        elif room:  # a resumed run with no answer left gives none at any event
            check_answer_event(ledger, self.name, plan, restore=restore)
        ledger.bind_documents(self.name, self.texts, guarantees_add_up=guarantees_add_up)
        if filters is not None:
            open_document_filters(ledger, self.name, **filters)
        open_answer_scopes(ledger, tenant, documents=self.documents, collection=self.cap)
        if room:
            ledger.check(
                tenant.tenant,
                self.name,
                stage="rag-answer",
                event=plan.worst_case_event(),
                relation=RELATION,
                delta=plan.delta,
            )


def require_collection_cap(ledger: PrivacyLedger, dataset: str) -> None:
    """Raises ValueError unless `dataset` has a collection cap (all tenants together)."""
    if ledger.collection_scope(dataset) is None:
        raise ValueError(
            f"{dataset} has no collection cap: add a tenant with `retriever tenant add NAME "
            f"--epsilon E --delta D --dataset {dataset} --collection-epsilon E "
            "--collection-delta D` first"
        )


def refuse_collection_cap(ledger: PrivacyLedger, dataset: str) -> None:
    """Raises ValueError if `dataset` has a collection cap (individual accounting replaces
    it with per-document filters)."""
    if ledger.collection_scope(dataset) is not None:
        raise ValueError(
            f"{dataset} has a collection cap, which composes every answer: individual "
            "accounting replaces it with per-document filters; serve another collection name"
        )


def require_document_filters(ledger: PrivacyLedger, dataset: str) -> DocumentFilter:
    """`dataset`'s per-document filters; ValueError if it has none or has a collection cap."""
    refuse_collection_cap(ledger, dataset)
    record = DocumentFilters(ledger.store).get(dataset)
    if record is None:
        raise ValueError(
            f"{dataset} has no per-document filters: serve it with --accounting individual "
            "--document-epsilon E --document-delta D"
        )
    return record


def accounting_of(ledger: PrivacyLedger, dataset: str) -> str:
    """The accounting mode of `dataset`: individual when it has per-document filters in
    the ledger, else collection (a collection cannot have both: each refuses the other)."""
    return "individual" if DocumentFilters(ledger.store).get(dataset) is not None else "collection"
