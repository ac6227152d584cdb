"""The service's responses: refusals in the documented error shape, request ids and the
one log line per request (`dpsynth.service.app`).

Every error is ``{"error", "detail", "request_id", ...}`` with an ``X-Request-Id`` header and
``Cache-Control: no-store``; a log line holds the request id, method, path, status and
public fields (tenant, epsilon, counts), never a question, a document, a score or a key.
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("dpsynth.service")


class Refusal(Exception):
    """An error status for a request, rendered as JSON; every status but 500 charges nothing."""

    def __init__(self, status: int, error: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail = status, error, detail
        self.headers = extra.pop("headers", None)
        self.extra = extra


def error_response(request_id: str, refusal: Refusal) -> JSONResponse:
    body = {"error": refusal.error, "detail": refusal.detail, "request_id": request_id}
    body.update(refusal.extra)
    return JSONResponse(body, status_code=refusal.status, headers=refusal.headers)


def _finish(
    request: Request,
    request_id: str,
    response: Response,
    fields: dict[str, Any],
    start: float,
    path: str | None = None,
) -> Response:
    """The request id and no-store headers on `response`, and the request's one log line
    (`path`: what to log for the path, default the request's)."""
    response.headers["X-Request-Id"] = request_id
    response.headers["Cache-Control"] = "no-store"
    if request.url.path != "/answer":  # an answer's time depends on the private set
        fields["ms"] = f"{1e3 * (time.perf_counter() - start):.1f}"
    described = " ".join(f"{k}={v}" for k, v in fields.items())
    log.info(
        "request_id=%s %s %s status=%d %s",
        request_id,
        request.method,
        request.url.path if path is None else path,
        response.status_code,
        described,
    )
    return response


def guarded(
    handler: Callable[..., Awaitable[dict[str, Any]]],
) -> Callable[..., Awaitable[Response]]:
    """Request id, one log line, refusals as JSON, and no private text in any log."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        request_id = secrets.token_hex(6)
        fields: dict[str, Any] = {}
        request.state.log = fields
        start = time.perf_counter()
        try:
            response = JSONResponse(await handler(request))
        except Refusal as refusal:
            fields["error"] = refusal.error
            response = error_response(request_id, refusal)
        except Exception as exc:  # noqa: BLE001 - the type only: messages may quote input
            fields["error"] = type(exc).__name__
            response = error_response(request_id, Refusal(500, "internal", "internal error"))
        return _finish(request, request_id, response, fields, start)

    return endpoint


def _http_refusal(exc: Exception) -> Refusal:
    """The documented error shape for what the framework refuses before any endpoint runs
    (an unknown path, a method an endpoint does not take, a request it cannot parse)."""
    if isinstance(exc, RequestValidationError):
        return Refusal(400, "bad_request", "the request does not fit this endpoint")
    if not isinstance(exc, StarletteHTTPException):
        return Refusal(500, "internal", "internal error")
    status, headers = exc.status_code, dict(exc.headers or {})
    if status == 404:
        return Refusal(404, "not_found", "no such endpoint", headers=headers)
    if status == 405:
        allowed = headers.get("allow", headers.get("Allow", ""))
        detail = (
            f"method not allowed here (allowed: {allowed})" if allowed else "method not allowed"
        )
        return Refusal(405, "method_not_allowed", detail, headers=headers)
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "error"
    return Refusal(
        status, phrase.lower().replace(" ", "_").replace("-", "_"), phrase, headers=headers
    )


async def framework_error(request: Request, exc: Exception) -> Response:
    request_id, start = secrets.token_hex(6), time.perf_counter()
    refusal = _http_refusal(exc)
    fields: dict[str, Any] = {"error": refusal.error}
    # a path that matched no endpoint is the client's own text: never logged verbatim
    path = "(unknown path)" if refusal.status == 404 else None
    response = error_response(request_id, refusal)
    return _finish(request, request_id, response, fields, start, path)


def invalid_text(value: Any) -> bool:
    """Whether a parsed JSON value holds a string (key or value) that is not valid Unicode,
    such as a lone surrogate escape ``"\\ud800"``: every later encoding of it would fail."""
    stack = [value]
    while stack:  # iterative: the body's depth is the client's choice
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def bearer_key(request: Request) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` header; the scheme is case-insensitive
    (RFC 7235 section 2.1)."""
    scheme, _, key = request.headers.get("authorization", "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None


async def read_json_body(
    request: Request, fields: frozenset[str], max_body_bytes: int
) -> dict[str, Any]:
    """The body as a JSON object of valid Unicode text with no field but `fields`, whatever
    its Content-Type (``curl -d`` sends form encoding); every refusal names what is wrong.
    One parser for every service of the toolkit (`retriever serve`, `serve --knowledge`)."""
    import json

    size = request.headers.get("content-length")
    if size is None or not size.isdigit():
        raise Refusal(411, "length_required", "send a Content-Length header")
    if int(size) > max_body_bytes:
        raise Refusal(413, "body_too_large", f"bodies are limited to {max_body_bytes} bytes")
    raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise Refusal(400, "invalid_utf8", f"the body is not UTF-8 (byte {error.start})") from None
    try:
        body = json.loads(text)
    except RecursionError:
        raise Refusal(400, "bad_request", "the body nests too deeply") from None
    except ValueError as error:
        where = getattr(error, "pos", None)
        raise Refusal(
            400,
            "invalid_json",
            "the body is not valid JSON"
            + ("" if where is None else f" (at character {where}: {error.msg})"),
        ) from None
    if not isinstance(body, dict):
        raise Refusal(400, "bad_request", "the body must be a JSON object")
    if invalid_text(body):
        raise Refusal(
            400,
            "bad_request",
            "the body holds text that is not valid Unicode (a lone "
            "surrogate escape such as \\ud800)",
        )
    unknown = sorted(set(body) - fields)
    if unknown:
        raise Refusal(
            400,
            "unknown_fields",
            f"unknown fields: {', '.join(unknown)} (this endpoint takes "
            f"{', '.join(sorted(fields))})",
            fields=unknown,
        )
    return body


def read_question(body: dict[str, Any], max_question_chars: int) -> str:
    """The body's question: non-empty text of at most `max_question_chars` characters."""
    question = body.get("question")
    if not isinstance(question, str):
        kind = "missing" if question is None else f"a JSON {type(question).__name__}"
        raise Refusal(400, "invalid_question", f"the question must be text, got {kind}")
    if not question.strip():
        raise Refusal(400, "empty_question", "the question must be non-empty text")
    if len(question) > max_question_chars:
        raise Refusal(
            413,
            "question_too_long",
            f"questions are limited to {max_question_chars} characters",
        )
    return question
