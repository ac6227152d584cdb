"""`NetworkQueryEngine` against real contributor servers and real misbehaving ones: merging,
re-ranking, local answers, partial results, timeouts, retries and strict validation."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import threading
import time

import httpx
import numpy as np
import pytest

from retriever.network.engine import Contributor, EngineConfig, NetworkQueryEngine
from retriever.network.local import Reranker, load_answer_lm, local_answer
from retriever.network.protocol import (
    MalformedResponse,
    parse_card,
    parse_retrieve,
    retry_after_seconds,
)
from retriever.network.response import STATUSES
from synthgen.privacy import PrivacyLedger
from tests.dpsynth.service.harness import bearer
from tests.retriever.network.harness import (
    ANSWER_EPSILON,
    CARD_DELTA,
    CARD_EPSILON,
    DATASET,
    ENCODER,
    established_connections,
    free_port_url,
    questions,
)

TRIO = ("north", "south", "east")


def contributors(network, names=TRIO) -> list[Contributor]:
    return [Contributor(network.url(n), network.keys[n], name=n) for n in names]


def misbehaving(network, behaviour: str, name: str | None = None) -> Contributor:
    """A contributor that misbehaves as told (it takes any key), named by its behaviour."""
    return Contributor(network.misbehaving.at(behaviour), "dpk_unused", name=name or behaviour)


@pytest.fixture
def question(network) -> str:
    return questions(network.world)[1]


def _direct(network, name: str, question: str, k: int) -> list[dict]:
    response = httpx.post(
        network.url(name) + "/retrieve",
        headers=bearer(network.keys[name]),
        json={"question": question, "k": k},
        timeout=30,
    )
    assert response.status_code == 200
    return response.json()["results"]


def test_merges_the_contributors_hits_by_score(network, question, caplog):
    engine = NetworkQueryEngine(contributors(network), config=EngineConfig(k=5))
    with caplog.at_level(logging.INFO, logger="retriever.network"):
        response = engine.query_sync(question, cards=True)
    assert [c.name for c in response.contributors] == list(TRIO)
    assert all(c.status == "ok" and c.hits == 5 and c.epsilon == 0.0 for c in response.contributors)
    for report in response.contributors:  # each release's own guarantee, from its card
        assert report.guarantee["epsilon"] == CARD_EPSILON
        assert report.guarantee["delta"] == CARD_DELTA
    assert response.contributors[0].served_answer["epsilon"] == ANSWER_EPSILON
    assert response.contributors[1].served_answer is None
    # the oracle: every contributor's own top 5, merged by score by hand
    union = [
        (r["score"], name, r["doc_id"], r["text"])
        for name in TRIO
        for r in _direct(network, name, question, 5)
    ]
    expected = sorted(union, key=lambda row: -row[0])[:5]
    got = [(h.score, h.contributor, h.doc_id, h.text) for h in response.documents]
    assert [g[1:] for g in got] == [e[1:] for e in expected]
    np.testing.assert_allclose([g[0] for g in got], [e[0] for e in expected], rtol=1e-6)
    assert response.reranked_by is None and response.answer is None
    body = response.to_json()
    assert json.loads(json.dumps(body)) == body and body["ok"] == 3 and body["failed"] == 0
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "status=ok" in logged
    assert question not in logged and not any(h.text in logged for h in response.documents)
    assert not any(key in logged for key in network.keys.values())


def test_rerank_rescores_every_hit_with_the_local_encoder(network, question):
    from retriever.evaluate import load_towers

    engine = NetworkQueryEngine(
        contributors(network), config=EngineConfig(k=6), reranker=Reranker.load(ENCODER)
    )
    response = engine.query_sync(question)
    assert response.reranked_by == ENCODER and len(response.documents) == 6
    encoder, _ = load_towers(ENCODER)
    texts = [h.text for h in response.documents]
    oracle = encoder.encode(texts) @ encoder.encode([question])[0]
    np.testing.assert_allclose([h.score for h in response.documents], oracle, rtol=1e-4, atol=1e-5)
    scores = [h.score for h in response.documents]
    assert scores == sorted(scores, reverse=True)
    # the six best of all 18 hits under the local encoder
    every = [r["text"] for n in TRIO for r in _direct(network, n, question, 6)]
    all_scores = encoder.encode(every) @ encoder.encode([question])[0]
    assert min(scores) >= np.sort(all_scores)[-6] - 1e-5


def test_local_answer_is_greedy_over_the_top_documents(network, question):
    lm, prompt = load_answer_lm("tiny")
    config = EngineConfig(k=4, answer_documents=3, max_answer_tokens=8)
    engine = NetworkQueryEngine(
        contributors(network), config=config, lm=lm, prompt=prompt, lm_name="tiny"
    )
    response = engine.query_sync(question)
    assert response.answered_by == "tiny" and isinstance(response.answer, str)
    oracle_lm, oracle_prompt = load_answer_lm("tiny")
    expected = local_answer(
        oracle_lm, oracle_prompt, question, [h.text for h in response.documents[:3]],
        max_tokens=8, max_document_tokens=config.max_document_tokens,
    )  # fmt: skip
    assert response.answer == expected


def test_a_refused_key_is_reported_not_dropped(network, question):
    network_with_a_wrong_key = [
        Contributor(network.url("north"), network.keys["north"], name="north"),
        Contributor(network.url("south"), network.keys["east"], name="south"),  # east's key
    ]
    response = NetworkQueryEngine(network_with_a_wrong_key).query_sync(question)
    north, south = response.contributors
    assert north.status == "ok" and north.hits > 0
    assert south.status == "refused" and south.reason.startswith("HTTP 401 unauthorized")
    assert south.attempts == 1 and south.epsilon is None and south.hits == 0
    assert {h.contributor for h in response.documents} == {"north"}


@pytest.mark.slow
def test_a_contributor_killed_mid_query_yields_a_partial_response(network, question):
    doomed = network.servers["doomed"]
    names = ("north", "east", "doomed")
    engine = NetworkQueryEngine(
        contributors(network, names), config=EngineConfig(k=5, timeout=20, retries=2)
    )
    assert engine.query_sync(question).failed == []  # all three up
    deadline = time.monotonic() + 20
    while established_connections(doomed.port) > 0:  # that query's connection is closing
        assert time.monotonic() < deadline, "a connection to doomed stays open"
        time.sleep(0.01)
    result: list = []
    os.kill(doomed.proc.pid, signal.SIGSTOP)  # requests reach its socket, none is answered
    try:
        worker = threading.Thread(target=lambda: result.append(engine.query_sync(question)))
        worker.start()
        deadline = time.monotonic() + 20
        while established_connections(doomed.port) == 0:  # the query is waiting on doomed
            assert time.monotonic() < deadline, "the query never reached the stopped server"
            time.sleep(0.01)
    finally:
        doomed.kill()  # SIGKILL (a stopped process dies too)
    worker.join(60)
    assert result, "the query never returned"
    response = result[0]
    by_name = {c.name: c for c in response.contributors}
    assert set(by_name) == set(names)
    dead = by_name["doomed"]
    assert dead.status in {"error", "timeout"} and dead.hits == 0
    assert "connection failed" in dead.reason and dead.attempts == 3  # bounded retries
    assert by_name["north"].status == by_name["east"].status == "ok"
    assert len(response.documents) == 5
    assert {h.contributor for h in response.documents} <= {"north", "east"}
    # and afterwards: down, reported as such, the others still answer
    later = engine.query_sync(question)
    assert [c.status for c in later.contributors] == ["ok", "ok", "error"]
    assert "ConnectError" in later.contributors[2].reason


@pytest.mark.parametrize("behaviour", ["hang", "stall"])
def test_a_hanging_contributor_hits_the_timeout(network, question, behaviour):
    engine = NetworkQueryEngine(
        [*contributors(network, ["north"]), misbehaving(network, behaviour)],
        config=EngineConfig(k=3, timeout=1.5),
    )
    response = engine.query_sync(question)
    north, bad = response.contributors
    assert north.status == "ok" and len(response.documents) == 3
    assert bad.status == "timeout" and bad.reason.startswith("no complete reply within 1.5 s")
    assert bad.hits == 0 and bad.attempts == 1


MALFORMED = [
    ("not-json", "malformed reply: the reply is not JSON"),
    ("wrong-schema", "malformed reply: 'results' is missing or not a list"),
    ("nan-score", "malformed reply: results[0].score is not a finite number"),
    ("too-many", "malformed reply: 50 results for k=3"),
    ("costly", "malformed reply: the contributor reports epsilon=0.5 for /retrieve"),
    ("oversize", "reply over 1048576 bytes rejected (cut off unread)"),
    ("oversize-declared", "reply over 1048576 bytes rejected (it declares 10485"),
]


@pytest.mark.parametrize(("behaviour", "reason"), MALFORMED, ids=[b for b, _ in MALFORMED])
def test_a_malformed_or_oversize_reply_is_rejected(network, question, behaviour, reason):
    engine = NetworkQueryEngine(
        [*contributors(network, ["south"]), misbehaving(network, behaviour)],
        config=EngineConfig(k=3, timeout=20),
    )
    response = engine.query_sync(question)
    south, bad = response.contributors
    assert south.status == "ok" and {h.contributor for h in response.documents} == {"south"}
    assert bad.status == "error" and bad.reason.startswith(reason), bad.reason
    assert bad.attempts == 1 and bad.hits == 0  # a bad reply is not retried
    assert "\n" not in bad.reason and len(bad.reason) < 200


def test_one_503_is_retried_after_its_retry_after(network, question):
    behaviour = f"flaky-{os.getpid()}-{time.monotonic_ns()}"
    engine = NetworkQueryEngine(
        [misbehaving(network, behaviour, name="flaky")],
        config=EngineConfig(k=3, timeout=20, retries=2, backoff=0.05),
    )
    (flaky,) = engine.query_sync(question).contributors
    assert flaky.status == "ok" and flaky.hits == 2 and flaky.attempts == 2
    first, second = network.misbehaving.request_times(behaviour)
    assert second - first >= 0.95  # Retry-After: 1 was honoured


def test_a_retry_after_beyond_the_timeout_gives_up_at_once(network, question):
    engine = NetworkQueryEngine(
        [misbehaving(network, "busy")],
        config=EngineConfig(k=3, timeout=5, retries=5),
    )
    (busy,) = engine.query_sync(question).contributors
    assert busy.status == "error" and busy.attempts == 1 and busy.http_status == 503
    assert "would pass the 5 s timeout" in busy.reason


def test_5xx_retries_are_bounded_and_4xx_never_retried(network, question):
    engine = NetworkQueryEngine(
        [
            misbehaving(network, "broken"),
            misbehaving(network, "forbidden"),
            Contributor(free_port_url(), "dpk_unused", name="nobody"),
        ],
        config=EngineConfig(k=3, timeout=20, retries=2, backoff=0.01),
    )
    before = {b: len(network.misbehaving.request_times(b)) for b in ("broken", "forbidden")}
    response = engine.query_sync(question)
    broken, forbidden, nobody = response.contributors
    assert broken.status == "error" and broken.attempts == 3
    assert broken.reason == "HTTP 500 internal: internal error after 3 attempts"
    assert forbidden.status == "refused" and forbidden.attempts == 1
    assert forbidden.reason == "HTTP 403 forbidden: invalid API key"
    assert nobody.status == "error" and nobody.attempts == 3 and nobody.http_status is None
    assert nobody.reason.startswith("connection failed (ConnectError)")
    after = {b: len(network.misbehaving.request_times(b)) for b in ("broken", "forbidden")}
    assert after["broken"] - before["broken"] == 3
    assert after["forbidden"] - before["forbidden"] == 1
    assert response.all_failed and response.documents == []


def test_answer_mode_reports_each_contributors_charge(network, question):
    book = PrivacyLedger(str(network.folders["north"].ledger))
    before = book.spent("client", DATASET).epsilon
    engine = NetworkQueryEngine(contributors(network, ("north", "south")))
    response = engine.query_sync(question, mode="answer", cards=True)
    north, south = response.contributors
    assert north.status == "ok" and 0 < north.epsilon <= ANSWER_EPSILON + 1e-9
    assert south.status == "refused" and "answer_not_served" in south.reason
    (answer,) = response.answers
    assert answer["contributor"] == "north" and isinstance(answer["text"], str)
    assert answer["epsilon"] == north.epsilon
    assert book.spent("client", DATASET).epsilon > before  # charged at north, to our tenant
    assert answer["remaining_epsilon"] == pytest.approx(
        book.spent("client", DATASET).epsilon_remaining
    )
    assert response.documents == []


@pytest.mark.slow
def test_load_twenty_concurrent_queries_over_three_contributors(network):
    asked = (questions(network.world) * 20)[:20]
    engine = NetworkQueryEngine(contributors(network), config=EngineConfig(k=5, timeout=30))

    async def run():
        await engine.fetch_cards()
        return await asyncio.gather(*(engine.query(q) for q in asked))

    responses = asyncio.run(run())
    assert len(responses) == 20
    for response in responses:
        assert [c.name for c in response.contributors] == list(TRIO)
        for report in response.contributors:
            assert report.status in STATUSES and report.reason
            assert report.ok or report.hits == 0
        assert len(response.documents) <= 5
        scores = [h.score for h in response.documents]
        assert scores == sorted(scores, reverse=True)
    outcomes = [c.status for r in responses for c in r.contributors]
    assert outcomes.count("ok") == 60, sorted(set(outcomes))  # healthy servers: all answer


# ---- the protocol's parsers and the engine's arguments (no server) ----------------------


def _reply(results, epsilon=0.0) -> bytes:
    return json.dumps({"results": results, "epsilon": epsilon}).encode()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[" * 100_000, "not JSON"),
        (b"\xff\xfe garbage", "not JSON"),
        (b'"results"', "JSON str, not an object"),
        (_reply([{"doc_id": "a", "text": "t", "score": True}]), "score is not a number"),
        (b'{"results": [{"doc_id": "a", "text": "t", "score": 1e999}], "epsilon": 0}', "finite"),
        (_reply([{"doc_id": "", "text": "t", "score": 1}]), "doc_id"),
        (_reply([{"doc_id": "a", "text": "x" * 101, "score": 1}]), "over 100 characters"),
        (_reply(["a"]), "results[0] is not an object"),
        (json.dumps({"results": []}).encode(), "no 'epsilon'"),
        (_reply([], epsilon=-1), "epsilon=-1"),
    ],
    ids=lambda value: None if isinstance(value, bytes) else value[:24],
)
def test_parse_retrieve_refuses_what_the_protocol_does_not_allow(body, message):
    with pytest.raises(MalformedResponse, match=re.escape(message)):
        parse_retrieve(body, k=3, max_text_chars=100)


def test_parse_retrieve_and_card_accept_valid_replies():
    hits = parse_retrieve(_reply([{"doc_id": "a", "text": "t", "score": 2}]), k=1, max_text_chars=5)
    assert hits == [{"doc_id": "a", "text": "t", "score": 2.0}]
    from retriever.network.folder import make_card

    card = make_card(
        contributor="x", epsilon=1.5, delta=1e-6, generator="g", model="m", encoder="e",
        num_documents=3,
    )  # fmt: skip
    summary = parse_card(json.dumps(card).encode())
    assert summary["contributor"] == "x" and summary["guarantee"]["epsilon"] == 1.5
    with pytest.raises(MalformedResponse, match="card"):
        parse_card(json.dumps({**card, "format": "other"}).encode())


def test_retry_after_and_arguments():
    assert retry_after_seconds("7") == 7.0 and retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    contributor = Contributor("http://127.0.0.1:9/", "dpk_secret")
    assert contributor.url == "http://127.0.0.1:9" and "dpk_secret" not in repr(contributor)
    with pytest.raises(ValueError, match="URL"):
        Contributor("ftp://x", "k")
    with pytest.raises(ValueError, match="distinct"):
        NetworkQueryEngine([contributor, Contributor("http://127.0.0.1:9", "k")])
    with pytest.raises(ValueError, match="timeout"):
        EngineConfig(timeout=0)
    engine = NetworkQueryEngine([contributor])
    with pytest.raises(ValueError, match="mode"):
        engine.query_sync("q", mode="guess")
    with pytest.raises(ValueError, match="non-empty"):
        engine.query_sync("  ")
