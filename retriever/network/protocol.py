"""The network protocol as a caller reads it: strict parsing of contributors' replies.

A contributor (`dpsynth.service.contributor`) replies with JSON; a caller trusts none of
it. Each parser accepts exactly what the protocol allows and raises `MalformedResponse`
with a one-line reason otherwise; reasons never quote the reply (it may echo the question).

Privacy:
  Parsing releases nothing. `parse_retrieve` refuses a ``/retrieve`` reply that reports a
  cost other than 0: retrieval from a DP release is post-processing, so a contributor that
  reports a cost for it is not following the protocol.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from typing import Any

from retriever.network.facts import is_fact_card
from retriever.network.folder import CARD_FORMAT

_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
DETAIL_CHARS = 160


class MalformedResponse(ValueError):
    """A contributor's reply is not what the protocol allows (the message says why)."""


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        raise MalformedResponse("the reply is not JSON") from None
    if not isinstance(value, dict):
        raise MalformedResponse(f"the reply is a JSON {type(value).__name__}, not an object")
    return value


def _finite(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MalformedResponse(f"{where} is not a number")
    try:
        number = float(value)
    except OverflowError:
        raise MalformedResponse(f"{where} is not a finite number") from None
    if not math.isfinite(number):
        raise MalformedResponse(f"{where} is not a finite number")
    return number


def parse_retrieve(
    body: bytes, *, k: int, max_text_chars: int, max_doc_id_chars: int = 256
) -> list[dict[str, Any]]:
    """The results of a ``/retrieve`` reply, checked against the protocol.

    A valid reply is a JSON object with ``"results"``: a list of at most `k` objects
    ``{"doc_id": str, "text": str, "score": finite number}`` (texts of at most
    `max_text_chars`), and ``"epsilon": 0`` (retrieval from a release is free).

    Raises:
      MalformedResponse: anything else (the message names the first problem).
    """
    reply = _json_object(body)
    results = reply.get("results")
    if not isinstance(results, list):
        raise MalformedResponse("'results' is missing or not a list")
    if len(results) > k:
        raise MalformedResponse(f"{len(results)} results for k={k}")
    if "epsilon" not in reply:
        raise MalformedResponse("no 'epsilon' in the reply (a /retrieve reply reports 0)")
    epsilon = _finite(reply["epsilon"], "'epsilon'")
    if epsilon != 0:
        raise MalformedResponse(
            f"the contributor reports epsilon={epsilon:g} for /retrieve (must be 0: retrieval "
            "from a DP release is post-processing)"
        )
    parsed = []
    for i, item in enumerate(results):
        if not isinstance(item, dict):
            raise MalformedResponse(f"results[{i}] is not an object")
        doc_id, text = item.get("doc_id"), item.get("text")
        if not isinstance(doc_id, str) or not 0 < len(doc_id) <= max_doc_id_chars:
            raise MalformedResponse(
                f"results[{i}].doc_id is not a string of 1-{max_doc_id_chars} characters"
            )
        if not isinstance(text, str):
            raise MalformedResponse(f"results[{i}].text is not a string")
        if len(text) > max_text_chars:
            raise MalformedResponse(f"results[{i}].text is over {max_text_chars} characters")
        score = _finite(item.get("score"), f"results[{i}].score")
        parsed.append({"doc_id": doc_id, "text": text, "score": score})
    return parsed


def parse_answer(body: bytes, *, max_text_chars: int) -> dict[str, Any]:
    """The answer of an ``/answer`` reply (text and what it cost), checked.

    Raises:
      MalformedResponse: not ``{"answer": {"text": str, "epsilon": finite >= 0, "delta":
        in [0, 1), "mechanism": str, "remaining_epsilon": finite or null, ...}}``.
    """
    answer = _json_object(body).get("answer")
    if not isinstance(answer, dict):
        raise MalformedResponse("'answer' is missing or not an object")
    text = answer.get("text")
    if not isinstance(text, str) or len(text) > max_text_chars:
        raise MalformedResponse(f"answer.text is not a string of at most {max_text_chars}")
    epsilon = _finite(answer.get("epsilon"), "answer.epsilon")
    delta = _finite(answer.get("delta"), "answer.delta")
    if epsilon < 0 or not 0 <= delta < 1:
        raise MalformedResponse(f"answer cost out of range: epsilon={epsilon:g} delta={delta:g}")
    mechanism = answer.get("mechanism")
    if not isinstance(mechanism, str) or not _NAME.fullmatch(mechanism.replace("-", "_")):
        raise MalformedResponse("answer.mechanism is not a mechanism name")
    remaining = answer.get("remaining_epsilon")
    if remaining is not None:
        remaining = _finite(remaining, "answer.remaining_epsilon")
    return {
        "text": text,
        "epsilon": epsilon,
        "delta": delta,
        "mechanism": mechanism,
        "remaining_epsilon": remaining,
    }


def parse_card(body: bytes) -> dict[str, Any]:
    """The public summary of a ``/card`` reply: contributor, guarantee, what it serves.

    Raises:
      MalformedResponse: not a card of `retriever.network.folder.CARD_FORMAT` with a
        finite epsilon >= 0 and 0 <= delta < 1.
    """
    card = _json_object(body)
    if card.get("format") != CARD_FORMAT:
        raise MalformedResponse(f"not a {CARD_FORMAT} card")
    guarantee = card.get("guarantee")
    if not isinstance(guarantee, dict):
        raise MalformedResponse("the card has no guarantee")
    epsilon = _finite(guarantee.get("epsilon"), "guarantee.epsilon")
    delta = _finite(guarantee.get("delta"), "guarantee.delta")
    if epsilon < 0 or not 0 <= delta < 1:
        raise MalformedResponse(f"guarantee out of range: epsilon={epsilon:g} delta={delta:g}")
    serves = card.get("serves") if isinstance(card.get("serves"), dict) else {}
    answer = serves.get("answer")
    served_answer = None
    if isinstance(answer, dict):
        served_answer = {
            "epsilon": _finite(answer.get("epsilon"), "serves.answer.epsilon"),
            "delta": _finite(answer.get("delta"), "serves.answer.delta"),
            "mechanism": str(answer.get("mechanism"))[:32],
        }

    def short(value: Any) -> str | None:
        return value[:200] if isinstance(value, str) else None

    return {
        "contributor": short(card.get("contributor")),
        "guarantee": {
            "epsilon": epsilon,
            "delta": delta,
            "privacy_unit": short(guarantee.get("privacy_unit")),
            "neighboring_relation": short(guarantee.get("neighboring_relation")),
            "seeded": bool(guarantee.get("seeded", False)),
        },
        "served_answer": served_answer,
        "fact_release": is_fact_card(card),
        "fact_noise_stddev": _fact_noise(guarantee),
    }


def _fact_noise(guarantee: Any) -> float | None:
    """The noise standard deviation a fact release's card states (finite, > 0), or None."""
    stages = guarantee.get("stages") if isinstance(guarantee, dict) else None
    for stage in stages if isinstance(stages, list) else []:
        value = stage.get("noise_stddev") if isinstance(stage, dict) else None
        if isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
            return float(value)
    return None


def refusal_reason(status: int, body: bytes) -> str:
    """``HTTP 403 forbidden: invalid API key``: the code and a short, one-line detail."""
    reason = f"HTTP {status}"
    try:
        reply = json.loads(body)
    except (ValueError, RecursionError):
        return reason
    if not isinstance(reply, dict):
        return reason
    error, detail = reply.get("error"), reply.get("detail")
    if isinstance(error, str) and _NAME.fullmatch(error):
        reason += f" {error}"
    if isinstance(detail, str) and detail:
        line = "".join(c if c.isprintable() else " " for c in detail.splitlines()[0])
        reason += f": {line[:DETAIL_CHARS]}"
    return reason


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
