"""The network query engine: one question fanned out to N contributors, their hits merged.

`NetworkQueryEngine` sends a question to every contributor's ``/retrieve`` at once (httpx,
asyncio), with a per-contributor timeout covering retries, validates every reply strictly,
merges the hits by score (raw scores are a heuristic across indexes; ``reranker`` re-scores
them with one local encoder), keeps the top k, and can answer with a local LM (from fact
releases as one release, `retriever.network.facts`). A contributor that fails costs its
hits, never the query: each is in the `NetworkResponse` with a status (``ok``,
``refused`` for 4xx, ``timeout``, ``error`` for transport errors, 5xx or a reply the
protocol does not allow) and a one-line reason. Retries back off exponentially with jitter
and honour a ``Retry-After`` that fits the time left; 4xx is never retried, nor in
``/answer`` anything that may have charged. See docs/guides/network.md.

Privacy:
  ``/retrieve`` returns post-processing of each contributor's DP release, so it costs
  nothing at any contributor; the engine checks that each reports epsilon 0 and shows each
  release's own guarantee from its card (`fetch_cards`). With ``mode="answer"`` each
  contributor returns a DP-RAG answer charged to the caller's tenant in its own ledger (the
  costs do not compose across contributors, whose collections differ). Re-ranking and the
  local LM read only released values (post-processing). Logs hold contributor names,
  statuses, counts and timings, never a question, a document or a key.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from retriever.network.local import Reranker, load_answer_lm, local_answer
from retriever.network.protocol import (
    MalformedResponse,
    parse_answer,
    parse_card,
    parse_retrieve,
    refusal_reason,
    retry_after_seconds,
)
from retriever.network.response import ContributorReport, Hit, NetworkResponse

__all__ = [
    "Contributor",
    "ContributorReport",
    "EngineConfig",
    "Hit",
    "NetworkQueryEngine",
    "NetworkResponse",
    "Reranker",
    "load_answer_lm",
    "local_answer",
]

log = logging.getLogger("retriever.network")

MODES = ("retrieve", "answer")


class _Oversize(Exception):
    """A body larger than the limit (raised before it is read in full)."""


# ---- configuration and results ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Contributor:
    """One contributor of the network.

    Attributes:
      url: its base URL (``http(s)://host:port[/prefix]``).
      key: the caller's API key at this contributor (never printed or logged).
      name: how the response names it (default: the URL).
    """

    url: str
    key: str = dataclasses.field(repr=False)
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not re.match(r"https?://[^\s/]+", self.url):
            raise ValueError(f"a contributor URL must be http(s)://host[:port], got {self.url!r}")
        object.__setattr__(self, "url", self.url.rstrip("/"))
        if not isinstance(self.key, str) or not self.key.strip():
            raise ValueError(f"contributor {self.label} needs an API key")

    @property
    def label(self) -> str:
        return self.name or self.url


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Public parameters and limits of the engine.

    Attributes:
      k: documents in the merged result (and asked of each contributor).
      timeout: seconds one contributor may take, retries and backoff included.
      retries: most extra attempts after a retryable failure.
      backoff: first backoff in seconds; doubled per attempt (with jitter), at most
        ``max_backoff``.
      max_backoff: longest backoff between two attempts.
      max_response_bytes: larger replies are cut off and rejected (streaming limit).
      max_text_chars: longest accepted document or answer text.
      max_doc_id_chars: longest accepted doc_id.
      answer_documents: merged documents the local LM reads.
      max_answer_tokens: most tokens of the local answer (greedy).
      max_document_tokens: a document's text is cut to this many tokens in the prompt.
      fact_k: records asked of a fact release for the local answer (at most its
        ``max_retrieve_k``, 20): a named phrase's record must be among them to be read
        (measured: `retriever.network.facts`).
    """

    k: int = 10
    timeout: float = 10.0
    retries: int = 2
    backoff: float = 0.2
    max_backoff: float = 2.0
    max_response_bytes: int = 1 << 20
    max_text_chars: int = 20_000
    max_doc_id_chars: int = 256
    answer_documents: int = 5
    max_answer_tokens: int = 32
    max_document_tokens: int = 160
    fact_k: int = 20

    def __post_init__(self) -> None:
        if self.k < 1 or self.answer_documents < 1 or self.max_answer_tokens < 1:
            raise ValueError(f"k, answer_documents, max_answer_tokens must be >= 1: {self=}")
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds: {self.timeout=}")
        if self.retries < 0 or not 0 <= self.backoff <= self.max_backoff < math.inf:
            raise ValueError(f"need retries >= 0 and 0 <= backoff <= max_backoff: {self=}")
        if min(self.max_response_bytes, self.max_text_chars, self.max_doc_id_chars) < 1:
            raise ValueError(f"size limits must be >= 1: {self=}")
        if self.max_document_tokens < 1 or self.fact_k < 1:
            raise ValueError(f"max_document_tokens and fact_k must be >= 1: {self=}")


# ---- the engine -------------------------------------------------------------------------


@dataclasses.dataclass
class _Outcome:
    """One contributor's report, and what it returned when it was ok."""

    report: ContributorReport
    hits: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    answer: dict[str, Any] | None = None


@dataclasses.dataclass
class _Reply:
    """A valid reply, parsed: its hits or answer, what it cost, one line about it."""

    reason: str
    epsilon: float
    hits: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    answer: dict[str, Any] | None = None


class NetworkQueryEngine:
    """Fans a question out to contributors and merges what comes back.

    Args:
      contributors: the network (names must be distinct).
      config: limits, timeout and retries.
      reranker: a local encoder that re-scores the merged hits (None: contributors' scores).
      lm: a local `synthgen.lm_backends.NextTokenLM` answering over the merged documents
        (None: documents only).
      prompt: its `retriever.rag.prompts.PromptFormat` (needed with `lm`).
      lm_name: how responses name the LM.

    Raises:
      ValueError: no contributor, two with one name, or `lm` without `prompt`.

    Privacy: see the module docstring; the engine itself draws no noise and keeps no state
    between queries but the cards.
    """

    def __init__(
        self,
        contributors: Sequence[Contributor],
        *,
        config: EngineConfig | None = None,
        reranker: Reranker | None = None,
        lm: Any = None,
        prompt: Any = None,
        lm_name: str | None = None,
    ) -> None:
        self.contributors = list(contributors)
        if not self.contributors:
            raise ValueError("a network query needs at least one contributor")
        labels = [c.label for c in self.contributors]
        if len(set(labels)) != len(labels):
            raise ValueError("contributor names must be distinct")
        if lm is not None and prompt is None:
            raise ValueError("a local lm needs a prompt format")
        self.config = config or EngineConfig()
        self.reranker, self.lm, self.prompt = reranker, lm, prompt
        self.lm_name = lm_name or (type(lm).__name__ if lm is not None else None)
        self.cards: dict[str, dict[str, Any]] = {}
        self.card_errors: dict[str, str] = {}
        self._lm_lock = threading.Lock()  # one LM session at a time
        self._jitter = random.Random()  # backoff jitter (public, not a mechanism)

    # ---- HTTP plumbing ----------------------------------------------------------------

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            timeout=httpx.Timeout(self.config.timeout),
            follow_redirects=False,
            limits=httpx.Limits(max_connections=max(100, 4 * len(self.contributors))),
            headers={"User-Agent": "dpsynth-network/1"},
        )

    async def _send(
        self,
        client: httpx.AsyncClient,
        method: str,
        url: str,
        *,
        headers: dict[str, str],
        payload: dict[str, Any] | None,
    ) -> tuple[int, httpx.Headers, bytes]:
        """One request; the body is read in chunks and cut off past the byte limit."""
        limit = self.config.max_response_bytes
        async with client.stream(method, url, headers=headers, json=payload) as response:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise _Oversize(f"it declares {int(declared)} bytes")
            size, chunks = 0, []
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise _Oversize("cut off unread")
                chunks.append(chunk)
            return response.status_code, response.headers, b"".join(chunks)

    def _backoff(self, attempt: int) -> float:
        config = self.config
        base = min(config.max_backoff, config.backoff * 2 ** (attempt - 1))
        return base * (0.5 + 0.5 * self._jitter.random())

    async def _call(
        self,
        client: httpx.AsyncClient,
        contributor: Contributor,
        path: str,
        payload: dict[str, Any],
        parse: Callable[[bytes], _Reply],
    ) -> _Outcome:
        """One contributor's outcome: never raises (but for cancellation)."""
        config = self.config
        report = ContributorReport(contributor.label, contributor.url, "error", "")
        start = time.monotonic()
        idempotent = path != "/answer"  # an /answer may be charged before a failure shows
        headers = {"Authorization": f"Bearer {contributor.key}"}

        def done(status: str, reason: str) -> _Outcome:
            report.status, report.reason = status, reason
            report.latency_s = round(time.monotonic() - start, 4)
            return _Outcome(report)

        try:
            async with asyncio.timeout(config.timeout):
                while True:
                    report.attempts += 1
                    wait: float | None = None
                    try:
                        status, reply_headers, body = await self._send(
                            client, "POST", contributor.url + path, headers=headers,
                            payload=payload,
                        )  # fmt: skip
                    except _Oversize as exc:
                        return done(
                            "error",
                            f"reply over {config.max_response_bytes} bytes rejected ({exc})",
                        )
                    except httpx.TimeoutException:
                        raise TimeoutError from None
                    except httpx.TransportError as exc:
                        failure = f"connection failed ({type(exc).__name__})"
                        if idempotent or isinstance(exc, httpx.ConnectError):
                            wait = self._backoff(report.attempts)
                    else:
                        report.http_status = status
                        if status == 200:
                            try:
                                reply = parse(body)
                            except MalformedResponse as exc:
                                return done("error", f"malformed reply: {exc}")
                            report.hits, report.epsilon = len(reply.hits), reply.epsilon
                            outcome = done("ok", reply.reason)
                            outcome.hits, outcome.answer = reply.hits, reply.answer
                            return outcome
                        if 400 <= status < 500:
                            return done("refused", refusal_reason(status, body))
                        if status < 500:
                            return done("error", f"unexpected HTTP {status}")
                        failure = refusal_reason(status, body)
                        if status == 503 or idempotent:
                            wait = self._backoff(report.attempts)
                            asked = retry_after_seconds(reply_headers.get("retry-after"))
                            if asked is not None:
                                wait = max(wait, asked)
                    tries = f"after {report.attempts} attempt{'s' * (report.attempts > 1)}"
                    if wait is None:  # /answer only
                        return done("error", f"{failure} (not retried: it may have been charged)")
                    if report.attempts > config.retries:
                        return done("error", f"{failure} {tries}")
                    left = config.timeout - (time.monotonic() - start)
                    if wait >= left:
                        return done(
                            "error",
                            f"{failure} {tries}; waiting {wait:.1f} s more would pass the "
                            f"{config.timeout:g} s timeout",
                        )
                    await asyncio.sleep(wait)
        except TimeoutError:
            return done(
                "timeout",
                f"no complete reply within {config.timeout:g} s "
                f"({report.attempts} attempt{'s' * (report.attempts > 1)})",
            )
        except Exception as exc:  # noqa: BLE001 - one contributor never breaks the query
            return done("error", f"internal error ({type(exc).__name__})")

    def _retrieve_parser(self, k: int) -> Callable[[bytes], _Reply]:
        config = self.config

        def parse(body: bytes) -> _Reply:
            hits = parse_retrieve(
                body, k=k, max_text_chars=config.max_text_chars,
                max_doc_id_chars=config.max_doc_id_chars,
            )  # fmt: skip
            return _Reply(f"{len(hits)} documents", 0.0, hits=hits)

        return parse

    def _answer_parser(self) -> Callable[[bytes], _Reply]:
        def parse(body: bytes) -> _Reply:
            answer = parse_answer(body, max_text_chars=self.config.max_text_chars)
            reason = f"answered at epsilon={answer['epsilon']:.4g}"
            return _Reply(reason, answer["epsilon"], answer=answer)

        return parse

    # ---- public API -------------------------------------------------------------------

    async def fetch_cards(self) -> dict[str, dict[str, Any] | None]:
        """GETs every contributor's public ``/card`` (no key sent); keeps the summaries.

        Returns:
          name -> `parse_card` summary (None where the card could not be fetched; the
          reason is in ``card_errors``).
        """
        config = self.config

        async def one(client: httpx.AsyncClient, contributor: Contributor) -> None:
            label = contributor.label
            try:
                async with asyncio.timeout(config.timeout):
                    status, _, body = await self._send(
                        client, "GET", contributor.url + "/card", headers={}, payload=None
                    )
                if status != 200:
                    raise MalformedResponse(refusal_reason(status, body))
                self.cards[label] = parse_card(body)
                self.card_errors.pop(label, None)
            except (TimeoutError, httpx.TimeoutException):
                self.card_errors[label] = f"no card within {config.timeout:g} s"
            except _Oversize:
                self.card_errors[label] = f"card over {config.max_response_bytes} bytes"
            except httpx.TransportError as exc:
                self.card_errors[label] = f"connection failed ({type(exc).__name__})"
            except MalformedResponse as exc:
                self.card_errors[label] = f"bad card: {exc}"

        async with self._client() as client:
            await asyncio.gather(*(one(client, c) for c in self.contributors))
        return {c.label: self.cards.get(c.label) for c in self.contributors}

    async def query(
        self, question: str, *, k: int | None = None, mode: str = "retrieve"
    ) -> NetworkResponse:
        """Asks every contributor at once; merges, re-ranks and answers locally.

        Args:
          question: the question (sent to the contributors only; never logged).
          k: documents to keep (default: the config's); asked of each contributor too.
          mode: "retrieve" (free ``/retrieve`` at every contributor) or "answer" (each
            contributor's DP ``/answer``, charged to the caller's tenant there).

        Returns:
          The response; contributors that failed are in it with their status and reason.

        Raises:
          ValueError: an empty question, a bad k or mode.

        Privacy: see the module docstring.
        """
        if not isinstance(question, str) or not question.strip():
            raise ValueError("the question must be non-empty text")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode=}")
        k = self.config.k if k is None else k
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k=}")
        start = time.monotonic()
        facts: set[str] = set()  # contributors answered as fact releases
        if self.lm is not None and mode == "retrieve":
            if any(c.label not in self.cards and c.label not in self.card_errors
                   for c in self.contributors):  # fmt: skip
                await self.fetch_cards()  # once: a card that failed is not asked again
            facts = {label for label, card in self.cards.items() if card.get("fact_release")}

        def ask(contributor: Contributor) -> tuple[str, dict[str, Any], Callable]:
            if mode == "answer":
                return "/answer", {"question": question}, self._answer_parser()
            asked = max(k, self.config.fact_k) if contributor.label in facts else k
            return "/retrieve", {"question": question, "k": asked}, self._retrieve_parser(asked)

        async with self._client() as client:
            outcomes = await asyncio.gather(
                *(self._call(client, c, *ask(c)) for c in self.contributors)
            )
        response = NetworkResponse(mode, k, [])
        hits: list[Hit] = []
        for contributor, outcome in zip(self.contributors, outcomes):
            report = outcome.report
            card = self.cards.get(contributor.label)
            if card is not None:
                report.guarantee = card["guarantee"]
                report.served_answer = card["served_answer"]
            response.contributors.append(report)
            log.info(
                "contributor=%s status=%s http=%s hits=%d attempts=%d ms=%.1f",
                contributor.label, report.status, report.http_status, report.hits,
                report.attempts, 1e3 * report.latency_s,
            )  # fmt: skip
            for rank, item in enumerate(outcome.hits):
                hits.append(
                    Hit(contributor.label, item["doc_id"], item["text"], item["score"],
                        item["score"], rank)
                )  # fmt: skip
            if outcome.answer is not None:
                response.answers.append({"contributor": contributor.label, **outcome.answer})
        if hits and self.reranker is not None:
            scores = await asyncio.to_thread(self.reranker.scores, question, [h.text for h in hits])
            hits = [dataclasses.replace(h, score=s) for h, s in zip(hits, scores)]
            response.reranked_by = self.reranker.name
        hits.sort(key=lambda h: -h.score)  # stable: ties keep contributor order, then rank
        response.documents = hits[:k]
        if self.lm is not None and mode == "retrieve":
            others = [h.text for h in response.documents if h.contributor not in facts]
            texts = others[: self.config.answer_documents]
            if facts:
                found = [[h["text"] for h in o.hits] for c, o in
                         zip(self.contributors, outcomes) if c.label in facts]  # fmt: skip
                answer, abstained, records = await asyncio.to_thread(
                    self._answer_from_facts, question, found
                )
                response.records = records
                if not (abstained and texts):  # a cluster release may still answer
                    response.answer, response.abstained = answer, abstained
            if response.answer is None and not response.abstained:
                response.answer = await asyncio.to_thread(self._answer_locally, question, texts)
            response.answered_by = self.lm_name
        response.elapsed_s = round(time.monotonic() - start, 4)
        log.info(
            "network query mode=%s contributors=%d ok=%d documents=%d ms=%.1f",
            mode, len(self.contributors), len(self.contributors) - len(response.failed),
            len(response.documents), 1e3 * response.elapsed_s,
        )  # fmt: skip
        return response

    def _answer_from_facts(self, question: str, found: list[list[str]]):
        from retriever.network.facts import fact_answer

        sigmas = [c["fact_noise_stddev"] for c in self.cards.values() if c.get("fact_noise_stddev")]
        with self._lm_lock:
            return fact_answer(self.lm, question, found, max(sigmas, default=None))

    def _answer_locally(self, question: str, texts: list[str]) -> str:
        with self._lm_lock:
            return local_answer(
                self.lm, self.prompt, question, texts,
                max_tokens=self.config.max_answer_tokens,
                max_document_tokens=self.config.max_document_tokens,
            )  # fmt: skip

    def query_sync(
        self,
        question: str,
        *,
        k: int | None = None,
        mode: str = "retrieve",
        cards: bool = False,
    ) -> NetworkResponse:
        """`query` from synchronous code (`asyncio.run`); `cards`: `fetch_cards` first."""

        async def run() -> NetworkResponse:
            if cards:
                await self.fetch_cards()
            return await self.query(question, k=k, mode=mode)

        return asyncio.run(run())
