"""What answering from a private collection assumes, checked before anything is charged.

`DPRag`'s mechanisms are DP for one document of the collection (add/remove-one) under
assumptions the answer loop cannot see. `load_dprag`, `retriever answer`, `retriever serve`
and the pipeline's rag stage check them here, before any scope is opened or charged:

1. **The encoder does not depend on the collection.** Every sensitivity argument of
   `retriever.rag` holds the question encoder and the document embeddings fixed. The
   encoder's provenance establishes it (`retriever.provenance.collection_independence`:
   a public pretrained model, or a DP-trained one whose guarantee then composes with the
   answers'), or the operator asserts it (``--encoder-independent-of-collection``); the
   assertion is recorded in the collection cap's notes in the ledger, where every
   answer's charge composes (`check_encoder`, `record_encoder_assertion`).
2. **δ below 1/n** for n documents: the per-answer δ and the δ cap of every scope of the
   collection. A δ of 1/n or more permits releasing one document outright; DP-SGD refuses
   it the same way (`synthgen.privacy.accounting.check_delta`).
3. **One budget per set of documents.** A collection is known by its records (keyed
   digests, `synthgen.privacy.ledger_documents`), not by its name alone: a new name whose
   records overlap, by even one record, those of a name that has charged is refused unless
   the operator passes ``--guarantees-add-up``, and the ledger then lists the names
   together with their composed total.
4. **One answer event per collection.** The ledger composes a collection's charges as if
   their parameters were fixed in advance; parameters chosen after seeing earlier answers
   are adaptive and void that statement. The first service or command that answers from a
   collection pins its answer event's public parameters on the collection cap
   (`answer_event_shape`, `PrivacyLedger.pin_event_shape`); any other shape is refused.

Privacy:
  Everything here reads public parameters, provenance and counts the operator already
  states (n, the number of documents, as the δ bound needs); no document text, id or score
  enters an error, a log or the ledger.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from retriever.provenance import collection_independence, encoder_provenance, read_provenance
from retriever.rag.answer import RELATION
from retriever.rag.plan import RETIRED, AnswerPlan
from synthgen.privacy import COLLECTION, PrivacyLedger, Scope, accounting
from synthgen.privacy.document_filters import DocumentFilter, DocumentFilters
from synthgen.privacy.individual import DocumentBudget
from synthgen.privacy.ledger_documents import GUARANTEES_FLAG
from synthgen.privacy.ledger_types import EventShapeError

ENCODER_FLAG = "--encoder-independent-of-collection"
SHAPE_FORMAT = 1


def _encoder_label(encoder: str) -> str:
    """How the ledger names an encoder: an asset's name, a folder's last component (no
    path of the operator's machine goes into the ledger)."""
    path = Path(encoder).expanduser()
    return path.resolve().name if path.is_dir() else str(encoder)


def check_encoder(encoder: str, *, asserted: bool = False) -> str | None:
    """Refuses an encoder not known to be independent of the collection it would score.

    Args:
      encoder: the encoder the index was built with (asset, folder).
      asserted: the operator asserts it was not trained on the collection
        (``--encoder-independent-of-collection``).

    Returns:
      None when its provenance establishes independence; else, when `asserted`, the public
      line to record in the collection cap's notes (`record_encoder_assertion`).

    Raises:
      ValueError: neither the provenance nor the operator establishes it.

    Privacy:
      The answers' sensitivity (retrieval threshold, token aggregation) assumes scores
      from an encoder fixed independently of the collection; an encoder trained on the
      collection without DP could encode any document. A DP-trained encoder may depend on
      the collection through its DP release only, and the guarantees compose (Dwork and
      Roth 2014, Thm. 3.16).
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
    ledger: PrivacyLedger, dataset: str, documents: int, scopes: list[Scope] | None = None
) -> None:
    """Refuses a δ cap >= 1/n among `scopes` (default: every scope of `dataset`).

    Raises:
      ValueError: naming the scope, its cap and n.
    """
    if scopes is None:
        scopes = [s for s in ledger.scopes() if s.dataset == dataset]
    for scope in scopes:
        check_delta(scope.delta_cap, documents, f"the delta cap of {_scope_name(scope)}")


def open_document_filters(
    ledger: PrivacyLedger,
    dataset: str,
    *,
    documents: int,
    epsilon: float,
    delta: float,
    plan: AnswerPlan,
) -> DocumentFilter:
    """Puts `dataset` in individual accounting: each document gets an (epsilon, delta)
    filter (`synthgen.privacy.document_filters`); the same settings again are a no-op.

    Args:
      ledger: the privacy ledger.
      dataset: the collection.
      documents: n, its number of documents (delta must be below 1/n).
      epsilon, delta: each document's target over every answer of every tenant.
      plan: the default answer's plan; its `document_rho` is the collection's public
        per-answer charge (what "exhausted" means in the summary).

    Raises:
      ValueError: the collection has a collection cap or charges recorded before its
        filters, a delta of 1/n or more, a plan
        without a zCDP curve or costing more than a whole filter, or filters with other
        settings.

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
    record = DocumentFilter(dataset, DocumentBudget(epsilon, delta), plan.document_rho(), documents)
    return filters.open(record)


def open_answer_scopes(
    ledger: PrivacyLedger, tenant: Scope, *, documents: int, collection: Scope | None = None
) -> None:
    """Opens the tenant's scope on a collection that has a collection cap or per-document
    filters, δ caps checked.

    A tenant scope opened on a collection with neither would be a fresh budget per tenant
    name, with nothing bounding them together: the collection cap (stored, or `collection`
    to open it) is required, as the service requires it, unless the collection is in
    individual accounting (`open_document_filters`), where the tenant's scope is a quota.
    An existing scope keeps its caps. Every scope of the dataset, and the new ones, must
    have a δ cap below 1/n; every check runs before anything is written.

    Args:
      ledger: the privacy ledger.
      tenant: the tenant's scope to open if it does not exist.
      documents: n, the collection's documents.
      collection: the collection cap to open if the dataset has none.

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
    existing = [s for s in ledger.scopes() if s.dataset == dataset]
    new = [s for s in (collection, tenant) if s is not None and s.dataset == dataset]
    new = [s for s in new if all(s.tenant != e.tenant for e in existing)]
    check_scope_deltas(ledger, dataset, documents, existing + new)
    if stored is None and collection is not None:
        ledger.ensure_scope(collection)
    ledger.ensure_scope(tenant)


def answer_event_shape(plan: AnswerPlan) -> str:
    """The canonical public description of an answer's event (what a collection pins).

    The plan's public inputs, which fix every stage's DP event: the mechanism, the
    per-answer (ε, δ), the most tokens and paid releases (derived: icl max_tokens, keywords
    and facts 1; kept so that shapes pinned before vote, sparse-vote and answer-vote were
    retired stay byte-identical), the retrieval and score shares of ε, the icl composition
    and the neighbouring relation. Parameters that change
    which documents or tokens are chosen but not the event (k, voters, score range) are
    left out: composition only needs the events fixed.
    """
    shape = {
        "format": SHAPE_FORMAT,
        "kind": "rag-answer",
        "relation": RELATION,
        "mechanism": plan.mechanism,
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "max_tokens": plan.max_tokens,
        "max_releases": plan.max_releases,
        # shares, not products: a differing epsilon is then named once
        "retrieval_share": round(plan.retrieval_epsilon / plan.epsilon, 12),
        "score_share": round(plan.score_epsilon / plan.epsilon, 12),
        "composition": plan.composition if plan.mechanism == "icl" else None,
    }
    return json.dumps(shape, sort_keys=True, separators=(",", ":"))


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


def _differences(recorded: str, requested: str) -> str:
    differing = _differing(recorded, requested)
    if differing is None:
        return "recorded by another program"
    return "; ".join(f"{k} {_shown(old)} recorded, {_shown(new)} here" for k, old, new in differing)


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


def _way_forward(dataset: str, recorded: str, requested: str) -> str:
    differing = _differing(recorded, requested)
    if differing is None:
        return "answer with the recorded settings (`retriever tenant list` shows them)"
    settings = ", ".join(f"{_SHAPE_OPTIONS.get(k, k)} {_shown(old)}" for k, old, _ in differing)
    return (
        f"to go on, use the recorded settings ({settings}). Other settings need another "
        f"collection name over the same documents, whose guarantee then adds up with "
        f"{dataset}'s (the ledger totals both): only deliberately, with --dataset NEW "
        f"{GUARANTEES_FLAG} and its own caps (`retriever tenant add NAME --dataset NEW "
        "--collection-epsilon E --collection-delta D`)"
    )


def _retired_mechanism(recorded: str) -> str | None:
    """The retired mechanism (`plan.RETIRED`) a recorded shape names, if any."""
    try:
        mechanism = json.loads(recorded).get("mechanism")
    except (json.JSONDecodeError, AttributeError):
        return None
    return mechanism if mechanism in RETIRED else None


def _shape_refusal(dataset: str, recorded: str, requested: str) -> ValueError:
    retired = _retired_mechanism(recorded)
    if retired is not None:  # its recorded settings cannot be used again: say so
        return ValueError(
            f"the collection {dataset} was pinned to {retired}, which was retired: its "
            "charges still compose in the ledger, but no answer can be given at that event "
            "any more. To answer from these documents (facts, keywords or icl), use another "
            f"collection name, whose guarantee then adds up with {dataset}'s (the ledger "
            f"totals both): --dataset NEW {GUARANTEES_FLAG} and its own caps (`retriever "
            "tenant add NAME --dataset NEW --collection-epsilon E --collection-delta D`)"
        )
    return ValueError(
        f"{dataset} already answers with another event ({_differences(recorded, requested)}): "
        "every answer charged to a collection must be the same event (adaptively chosen "
        f"events void the ledger's composition); {_way_forward(dataset, recorded, requested)}"
    )


def check_answer_event(ledger: PrivacyLedger, dataset: str, plan: AnswerPlan) -> None:
    """Read-only: refuses a plan whose shape differs from the one `dataset` pinned (to
    refuse before loading anything heavy; `pin_answer_event` decides atomically)."""
    if ledger.collection_scope(dataset) is None:
        return
    shape = answer_event_shape(plan)
    recorded = ledger.event_shape(COLLECTION, dataset)
    if recorded is not None and recorded != shape:
        raise _shape_refusal(dataset, recorded, shape)


def pin_answer_event(ledger: PrivacyLedger, dataset: str, plan: AnswerPlan) -> None:
    """Pins `plan`'s event shape on `dataset`'s collection cap, or checks the pinned one.

    Raises:
      ValueError: no collection cap, or another shape pinned (nothing changes).
    """
    if ledger.collection_scope(dataset) is None:
        raise ValueError(f"{dataset} has no collection cap to record its answer event on")
    shape = answer_event_shape(plan)
    try:
        ledger.pin_event_shape(COLLECTION, dataset, shape)
    except EventShapeError as exc:
        raise _shape_refusal(dataset, exc.recorded, shape) from None


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
        ids = tuple(doc_ids) if doc_ids is not None else ()
        if not texts:
            raise ValueError(f"collection {name} has no documents")
        return cls(name, len(texts), cap, ids, tuple(texts))

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
    ) -> None:
        """Every check an answer from this collection needs, then its scopes opened.

        In order, refusing before anything is written: the per-answer δ below 1/n; in
        individual accounting (`document_target` given) no encoder assertion, every δ cap
        below 1/n and the per-document filters (opened, or checked against the stored
        ones); in collection accounting no filters and the collection's pinned answer event;
        the documents bound to the name (`PrivacyLedger.bind_documents`: a new name over
        documents other names have charged is refused without `guarantees_add_up`); then
        the filters (individual accounting) and scopes opened and the answer's worst case
        checked against every cap.

        Raises:
          ValueError: any check above (one line naming the option to change).
          SharedDocumentsError: other names guard these documents.
          BudgetExceededError: the answer's worst case exceeds a cap.
        """
        check_delta(plan.delta, self.documents, "--delta (per answer)")
        filters = DocumentFilters(ledger.store)
        if document_target is not None:
            if encoder_assertion is not None:
                raise ValueError(
                    f"{ENCODER_FLAG} is recorded on a collection cap, which individual "
                    "accounting does not have: build the index with a public pretrained or "
                    "DP-trained encoder"
                )
            existing = [s for s in ledger.scopes() if s.dataset == self.name]
            new = [] if any(s.tenant == tenant.tenant for s in existing) else [tenant]
            check_scope_deltas(ledger, self.name, self.documents, existing + new)
            self._bind(ledger, guarantees_add_up)
            # refuses a collection cap, a document delta of 1/n or more, an answer costing
            # more than a whole filter and filters with other settings, before writing
            open_document_filters(
                ledger,
                self.name,
                documents=self.documents,
                epsilon=document_target[0],
                delta=document_target[1],
                plan=plan,
            )
        else:
            if filters.get(self.name) is not None:
                raise ValueError(
                    f"{self.name} is in individual accounting (per-document filters): answer "
                    "with --accounting individual and its --document-epsilon / --document-delta"
                )
            check_answer_event(ledger, self.name, plan)
            self._bind(ledger, guarantees_add_up)
        open_answer_scopes(ledger, tenant, documents=self.documents, collection=self.cap)
        ledger.check(
            tenant.tenant,
            self.name,
            stage="rag-answer",
            event=plan.worst_case_event(),
            relation=RELATION,
            delta=plan.delta,
        )

    def _bind(self, ledger: PrivacyLedger, guarantees_add_up: bool) -> None:
        ledger.bind_documents(self.name, self.texts, guarantees_add_up=guarantees_add_up)


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
