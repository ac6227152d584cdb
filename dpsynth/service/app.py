"""The DP-RAG service: a FastAPI app over `retriever.rag.DPRag` and the privacy ledger.

Endpoints ``/health``, ``/retrieve``, ``/answer``, ``/budget``, ``/card`` and ``/`` (the
page). See docs/guides/service.md for each endpoint, refusals and errors, and the trust model.

Privacy: every answer is one fixed event (the service's per-answer epsilon and mechanism),
charged to the tenant's scope and the collection's cap in one ledger transaction before any
noise is drawn, so a client that disconnects after the charge is charged all the same.
Only the number of answers is the tenants' choice, which keeps the ledger's composition
statement non-adaptive. Colluding tenants add up and the collection's cap bounds them
together; an answer that ends early on a released value leaks only released values to
other tenants' timings, also under that cap. Refusals charge nothing. Individual
accounting (icl only) gives each document its own zCDP filter instead of the collection
cap (Feldman & Zrnic 2021). Logs hold ids, tenant names, epsilon, counts and timings, never
a question, a document, a score or a key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import time
from collections import defaultdict
from importlib import resources
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from dpsynth.service.admission import Admission, QueueFullError, QueueTimeoutError
from dpsynth.service.public_index import PublicIndex
from dpsynth.service.responses import (
    Refusal,
    bearer_key,
    framework_error,
    guarded,
    read_json_body,
    read_question,
)
from dpsynth.service.tenants import AuthError, TenantRegistry
from retriever.rag.answer import RELATION, DPRag
from retriever.rag.collection import (
    accounting_of,
    require_collection_cap,
    require_document_filters,
)
from retriever.rag.plan import check_mechanism
from synthgen.privacy import (
    COLLECTION,
    BudgetExceededError,
    PrivacyLedger,
    format_epsilon,
    format_remaining,
)
from synthgen.privacy.document_filters import DocumentFilters
from synthgen.privacy.errors import UnsupportedEventError


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """Public parameters and limits of the service.

    Attributes:
      answer_epsilon: every answer's epsilon (the same event for every answer: see above).
      mechanism: every answer's mechanism ("icl", "keywords" or "facts"; a retired one,
        `retriever.rag.plan.RETIRED`, is refused with what to use instead).
      max_question_chars: longer questions get 413 (before they are tokenized).
      max_question_tokens: questions longer in tokens of the answer LM get 413 before they
        queue (a short question of many-token characters could hold a replica for minutes).
      answer_timeout: seconds an answer may run once a replica starts it; past them it
        returns truncated, charged as usual.
      max_body_bytes: larger request bodies get 413 unread.
      queue_capacity: most requests waiting for a model replica (503 beyond).
      queue_timeout: seconds a request may wait for a replica (503 beyond).
      min_epsilon: a tenant with less epsilon left has an exhausted budget.
      max_retrieve_k: most results of ``/retrieve``.
      charge_log_limit: most recent charges listed by ``/budget``.
      max_answers_shown: ``/budget``'s ``answers_left`` counts up to this many.
      share_document_summary: individual accounting: ``/budget`` gives tenants the
        collection's per-document summary. Off by default: it is not DP (how many
        documents a question exhausts tells how many are relevant to it).
    """

    answer_epsilon: float = 1.0
    mechanism: str = "icl"
    max_question_chars: int = 1000
    max_question_tokens: int = 128
    answer_timeout: float = 120.0
    max_body_bytes: int = 65536
    queue_capacity: int = 16
    queue_timeout: float = 30.0
    min_epsilon: float = 0.01
    max_retrieve_k: int = 20
    charge_log_limit: int = 100
    max_answers_shown: int = 100
    share_document_summary: bool = False

    def __post_init__(self) -> None:
        limits = (self.max_question_chars, self.max_question_tokens, self.max_retrieve_k)
        if min(*limits, self.charge_log_limit, self.max_answers_shown) < 1:
            raise ValueError(f"limits must be >= 1: {self=}")
        if not 0 < self.answer_timeout < math.inf:
            raise ValueError(f"need 0 < answer_timeout < inf: {self=}")
        if self.queue_capacity < 0 or not self.queue_timeout > 0:
            raise ValueError(f"need queue_capacity >= 0 and queue_timeout > 0: {self=}")
        if not 0 < self.min_epsilon <= self.answer_epsilon < math.inf:
            raise ValueError(f"need 0 < min_epsilon <= answer_epsilon < inf: {self=}")
        check_mechanism(self.mechanism)
        if self.max_body_bytes < 2 * self.max_question_chars:
            raise ValueError(f"max_body_bytes too small for max_question_chars: {self=}")


@dataclasses.dataclass
class Service:
    """What one server process serves.

    Attributes:
      ledger: the privacy ledger (SQLite file or PostgreSQL URL).
      registry: the tenants of that ledger.
      dataset: the private collection's name in the ledger.
      replicas: answer stages over the collection, one LM session each (empty: ``/answer``
        is not served, and the collection needs no cap to start). All in collection
        accounting (the collection needs a collection cap) or all in individual accounting
        (per-document filters, no collection cap, icl answers).
      public: the public/synthetic index of ``/retrieve`` (None: not served).
      config: limits.
      card: the public card served at ``/card`` (None: not served).
    """

    ledger: PrivacyLedger
    registry: TenantRegistry
    dataset: str
    replicas: list[DPRag]
    public: PublicIndex | None = None
    config: ServiceConfig = ServiceConfig()
    card: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.admission: Admission | None = None
        if self.replicas:
            modes = {rag.config.accounting for rag in self.replicas}
            if len(modes) != 1:
                raise ValueError(f"replicas must share one accounting mode, got {sorted(modes)}")
            if self.individual:
                if self.config.mechanism != "icl":
                    raise ValueError(
                        "individual accounting answers with icl only (per-document filters "
                        f"take zCDP curves), got mechanism={self.config.mechanism!r}"
                    )
                require_document_filters(self.ledger, self.dataset)
            else:
                require_collection_cap(self.ledger, self.dataset)
            self._check_tenant_accountants()
            self.admission = Admission(
                self.replicas,
                capacity=self.config.queue_capacity,
                timeout=self.config.queue_timeout,
            )

    def _check_tenant_accountants(self) -> None:
        """Refuses to start when an active tenant's scope cannot compose this server's
        answer event (an rdp scope and bounded-range icl tokens, an (epsilon, delta)
        event): every answer would be refused. A read-only check, nothing is charged."""
        plan = self.replicas[0].plan(self.config.mechanism, self.config.answer_epsilon)
        for tenant in self.registry.tenants():
            if not tenant.active:
                continue
            try:
                self.replicas[0].check_budget(tenant.name, plan)
            except (KeyError, BudgetExceededError):  # no scope here, or spent: not this
                continue
            except UnsupportedEventError as exc:
                raise ValueError(_accountant_refusal(tenant.name, exc)) from None

    @property
    def individual(self) -> bool:
        """Whether answers are charged to per-document filters (individual accounting)."""
        return bool(self.replicas) and self.replicas[0].config.individual

    # ---- blocking helpers (run in worker threads) -----------------------------------

    def budget_refusal(self, tenant: str, epsilon: float, exc: BudgetExceededError) -> Refusal:
        """The 402 for an answer whose worst case does not fit (remaining budget in it)."""
        spend = self.ledger.spent(tenant, self.dataset)
        remaining = spend.epsilon_remaining
        cap = self.ledger.get_scope(tenant, self.dataset).epsilon_cap
        if exc.tenant == COLLECTION:
            error = "collection_budget_exhausted"
            detail = "the collection's budget over all tenants does not cover this answer"
        elif remaining < self.config.min_epsilon:
            error, detail = "budget_exhausted", f"the budget of {tenant} is spent"
        else:
            error = "epsilon_above_remaining"
            detail = f"epsilon={epsilon:g} does not fit the remaining budget of {tenant}"
        return Refusal(
            402,
            error,
            detail,
            remaining_epsilon=remaining,
            remaining_epsilon_text=format_remaining(cap, spend.epsilon),
            requested_epsilon=epsilon,
            epsilon_cap=cap,
        )

    def precheck(self, tenant: str, question: str) -> None:
        """Refuses, before the request waits for a replica, an answer that cannot fit, a
        question longer than ``config.max_question_tokens`` tokens of the answer LM, or one
        that `DPRag.answer` would refuse (public lengths and parameters only)."""
        config = self.config
        rag = self.replicas[0]
        if len(rag.lm.encode(question)) > config.max_question_tokens:
            raise Refusal(
                413,
                "question_too_long",
                f"questions are limited to {config.max_question_tokens} tokens of the answer LM",
                max_question_tokens=config.max_question_tokens,
            )
        try:
            plan = rag.validate(question, config.mechanism, config.answer_epsilon)
        except ValueError as exc:
            raise Refusal(400, "bad_request", str(exc)) from None
        try:
            rag.check_budget(tenant, plan)
        except UnsupportedEventError as exc:  # a tenant added after the server started
            refusal = _accountant_refusal(tenant, exc)
            raise Refusal(409, "accountant_cannot_compose", refusal) from None
        except KeyError:
            raise _no_budget(tenant) from None
        except BudgetExceededError as exc:
            raise self.budget_refusal(tenant, config.answer_epsilon, exc) from None

    def answers_left(self, tenant: str) -> int | None:
        """How many more answers the ledger admits for `tenant` (None: no /answer here).

        The ledger's own check of the service's fixed answer event
        (`PrivacyLedger.repeats_that_fit`), at most ``config.max_answers_shown``.
        """
        if not self.replicas:
            return None
        plan = self.replicas[0].plan(self.config.mechanism, self.config.answer_epsilon)
        return self.ledger.repeats_that_fit(
            tenant,
            self.dataset,
            plan.stage_events(),
            relation=RELATION,
            delta=plan.delta,
            limit=self.config.max_answers_shown,
        )

    def _document_terms(self) -> dict[str, Any]:
        """``/budget``'s ``documents``: the summary when the operator shares it, else the
        public target only (``{"documents", "epsilon", "delta"}`` and ``shared: False``)."""
        filters = DocumentFilters(self.ledger.store)
        if self.config.share_document_summary:
            return filters.summary(self.dataset)
        record = filters.get(self.dataset)
        return {
            "documents": record.documents,
            "epsilon": record.budget.epsilon,
            "delta": record.budget.delta,
            "shared": False,
        }

    def budget(self, tenant: str) -> dict[str, Any]:
        """What ``/budget`` returns to `tenant` (its scope on the collection).

        In individual accounting the tenant's figures are its quota, and ``documents`` is
        the collection's public target or its summary (`_document_terms`).

        Raises:
          KeyError: the tenant has no scope on the collection.

        Privacy:
          The tenant's own spend and charge log are functions of its own requests and the
          public per-answer events. Per-document figures depend on the private collection
          and are never returned; the summary's aggregates are not DP either and are
          returned only when the operator opts in.
        """
        scope = self.ledger.get_scope(tenant, self.dataset)
        spend = self.ledger.spent(tenant, self.dataset)
        charges = self.ledger.charges(tenant, self.dataset)
        by_stage: dict[str, dict[str, float]] = defaultdict(
            lambda: {"charges": 0, "standalone_epsilon_sum": 0.0}
        )
        for c in charges:  # sums of standalone figures; the spend is their composition
            by_stage[c.stage]["charges"] += 1
            by_stage[c.stage]["standalone_epsilon_sum"] += c.epsilon
        recent = charges[-self.config.charge_log_limit :]
        accounting = accounting_of(self.ledger, self.dataset)
        documents = {}
        if accounting == "individual":
            documents["documents"] = self._document_terms()
        return {
            "tenant": tenant,
            "dataset": self.dataset,
            "accounting": accounting,
            **documents,
            "epsilon_cap": scope.epsilon_cap,
            "delta_cap": scope.delta_cap,
            "accountant": scope.accountant,
            "spent_epsilon": spend.epsilon,
            "spent_epsilon_text": format_epsilon(spend.epsilon),
            "remaining_epsilon": spend.epsilon_remaining,
            "remaining_epsilon_text": format_remaining(scope.epsilon_cap, spend.epsilon),
            "num_charges": spend.num_charges,
            "answers_left": self.answers_left(tenant),
            "answers_left_limit": self.config.max_answers_shown,
            "by_stage": dict(by_stage),
            "charges": [
                {
                    "stage": c.stage,
                    "epsilon": c.epsilon,
                    "delta": c.delta,
                    "created_at": iso_time(c.created_at),
                    "ref": c.ref,
                }
                for c in recent
            ],
        }


def iso_time(seconds: float) -> str:
    """A Unix time as ISO 8601 in UTC ("2026-11-27T09:51:02.123456+00:00")."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat()


def create_app(service: Service) -> FastAPI:
    """The FastAPI app serving `service`."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        # ledger and key lookups run in worker threads, each holding its own database
        # connection on PostgreSQL: bound them
        anyio.to_thread.current_default_thread_limiter().total_tokens = 8
        yield
        if service.admission is not None:
            service.admission.close()

    app = FastAPI(
        title="dpsynth DP-RAG", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    for kind in (StarletteHTTPException, RequestValidationError, Exception):
        app.add_exception_handler(kind, framework_error)
    page = resources.files("dpsynth.service").joinpath("page.html").read_text()
    config = service.config

    async def authenticate(request: Request) -> str:
        key = bearer_key(request)
        try:
            tenant = await run_in_threadpool(service.registry.authenticate, key)
        except AuthError as exc:
            error = "unauthorized" if exc.status == 401 else "forbidden"
            raise Refusal(exc.status, error, str(exc)) from None
        request.state.log["tenant"] = tenant.name
        return tenant.name

    async def json_body(request: Request, fields: frozenset[str]) -> dict[str, Any]:
        return await read_json_body(request, fields, config.max_body_bytes)

    def question_of(body: dict[str, Any]) -> str:
        return read_question(body, config.max_question_chars)

    @app.get("/health")
    @guarded
    async def health(request: Request) -> dict[str, Any]:
        if bearer_key(request) is None:
            return {"status": "ok"}
        try:
            await authenticate(request)
        except Refusal:  # a liveness probe: a bad key is not an error here
            return {"status": "ok"}
        answers = service.admission is not None
        terms = {"accounting": "individual" if service.individual else "collection"}
        if answers and service.individual:  # public parameters of the per-document filters
            record = await run_in_threadpool(
                DocumentFilters(service.ledger.store).get, service.dataset
            )
            terms.update(
                relevance_threshold=service.replicas[0].config.relevance_threshold,
                document_epsilon=record.budget.epsilon,
                document_delta=record.budget.delta,
            )
        # no busy/waiting counts: the queue's depth would time other tenants' answers
        return {
            "status": "ok",
            "dataset": service.dataset,
            "replicas": len(service.replicas),
            "queue_capacity": config.queue_capacity,
            "retrieve": service.public is not None,
            "answer": answers,
            "answer_epsilon": config.answer_epsilon if answers else None,
            "mechanism": config.mechanism if answers else None,
            "answer_timeout": config.answer_timeout if answers else None,
            "max_question_chars": config.max_question_chars,
            "max_question_tokens": config.max_question_tokens if answers else None,
            "card": service.card is not None,
            **terms,
        }

    @app.get("/card")
    @guarded
    async def card(request: Request) -> dict[str, Any]:
        if service.card is None:
            raise Refusal(404, "no_card", "this service has no card")
        return service.card

    @app.get("/", response_class=HTMLResponse)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)

    @app.post("/retrieve")
    @guarded
    async def retrieve(request: Request) -> dict[str, Any]:
        await authenticate(request)
        body = await json_body(request, frozenset({"question", "k"}))
        question = question_of(body)
        if service.public is None:
            raise Refusal(404, "no_public_index", "this service has no public index")
        k = body.get("k", 5)
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= config.max_retrieve_k:
            raise Refusal(400, "bad_k", f"k must be an integer in [1, {config.max_retrieve_k}]")
        results = await run_in_threadpool(service.public.search, question, k)
        request.state.log["results"] = len(results)
        return {"results": results, "epsilon": 0.0}

    @app.post("/answer")
    @guarded
    async def answer(request: Request) -> dict[str, Any]:
        tenant = await authenticate(request)
        admission = service.admission
        if admission is None:
            raise Refusal(404, "answer_not_served", "this service serves no DP answers")
        body = await json_body(request, frozenset({"question", "epsilon", "mechanism"}))
        question = question_of(body)
        epsilon = body.get("epsilon", config.answer_epsilon)
        try:
            if isinstance(epsilon, bool) or not isinstance(epsilon, int | float):
                raise TypeError
            epsilon = float(epsilon)
        except (TypeError, OverflowError):
            raise Refusal(400, "bad_epsilon", "epsilon must be a number") from None
        if not math.isclose(epsilon, config.answer_epsilon, rel_tol=1e-9):
            raise Refusal(
                400,
                "epsilon_not_offered",
                f"this service answers at epsilon={config.answer_epsilon:g} only (one event "
                "per answer keeps the ledger's composition valid)",
            )
        if body.get("mechanism", config.mechanism) != config.mechanism:
            raise Refusal(
                400, "mechanism_not_offered", f"this service answers with {config.mechanism}"
            )
        epsilon, mechanism = config.answer_epsilon, config.mechanism
        request.state.log.update(epsilon=f"{epsilon:g}", mechanism=mechanism)
        await run_in_threadpool(service.precheck, tenant, question)

        def run(rag: DPRag):
            deadline = time.monotonic() + config.answer_timeout  # from the replica's start
            return rag.answer(
                question, tenant=tenant, epsilon=epsilon, mechanism=mechanism, deadline=deadline
            )

        retry = {"Retry-After": str(admission.retry_after())}
        try:
            result = await admission.run(run)
        except QueueFullError:
            raise Refusal(
                503, "queue_full", "every model replica is busy; retry later", headers=retry
            ) from None
        except QueueTimeoutError:
            raise Refusal(
                503,
                "queue_timeout",
                "timed out waiting for a model replica; nothing was charged",
                headers=retry,
            ) from None
        except BudgetExceededError as exc:  # another answer spent the budget meanwhile
            raise await run_in_threadpool(service.budget_refusal, tenant, epsilon, exc) from None
        except Exception as exc:  # noqa: BLE001 - after the charge: never echo the message
            request.state.log["error"] = type(exc).__name__
            raise Refusal(
                500, "internal", "internal error; /budget shows whether this answer was charged"
            ) from None
        charged = 0.0 if result.reused else result.epsilon
        request.state.log.update(tokens=result.tokens, charged=format_epsilon(charged))
        return {"tenant": tenant, "answer": result.to_json()}

    @app.get("/budget")
    @guarded
    async def budget(request: Request) -> dict[str, Any]:
        tenant = await authenticate(request)
        try:
            return await run_in_threadpool(service.budget, tenant)
        except KeyError:
            raise _no_budget(tenant) from None

    return app


def _no_budget(tenant: str) -> Refusal:
    return Refusal(403, "no_budget", f"tenant {tenant} has no budget on this collection")


def _accountant_refusal(tenant: str, exc: UnsupportedEventError) -> str:
    return (
        f"the budget of {tenant} cannot account for this server's answers ({exc}): the "
        "operator re-adds the tenant with --accountant pld or basic"
    )
