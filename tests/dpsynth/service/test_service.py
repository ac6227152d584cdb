"""`retriever serve` as a real uvicorn process: answers, budgets, every refusal, keys and logs."""

import sqlite3

import httpx
import pytest

from retriever.rag import RagConfig, ScoreRange
from retriever.rag.answer import RELATION, plan_answer
from synthgen.privacy import COLLECTION, BudgetExceededError, PrivacyLedger
from tests.dpsynth.service.harness import Server, add_tenants, bearer, cli, questions

CAPS = {"alice": 3.0, "bob": 1.5, "carol": 3.0, "dave": 3.0, "erin": 1.0}
COLLECTION_CAP = 3.2  # every answer costs 1.0; 4 compose to 3.01, 5 to 3.45 (PLD)
SERVED = RagConfig(k=4, max_tokens=6, score_range=ScoreRange(0.2, 1.0))  # as in harness.Server


@pytest.fixture(scope="module")
def served(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    ledger = str(root / "ledger.sqlite")
    keys = add_tenants(ledger, CAPS, collection=COLLECTION_CAP)
    cli("tenant", "revoke", "dave", "--ledger", ledger)
    server = Server(world, ledger, root / "server.log").start()
    yield server, keys, PrivacyLedger(ledger), root
    server.stop()


def _post(server, path, key, body, **kw):
    headers = bearer(key) if key is not None else {}
    return httpx.post(server.url + path, headers=headers, json=body, timeout=60, **kw)


def _all_charges(book):
    return book.charges(COLLECTION, "corpus")


def test_health_and_page(served):
    server, keys, *_ = served
    health = httpx.get(server.url + "/health", headers=bearer(keys["alice"])).json()
    assert health["status"] == "ok" and health["dataset"] == "corpus" and health["replicas"] == 1
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and 'id="ask"' in page.text


def test_answer_is_charged_and_budget_shows_it(served, world):
    server, keys, book, _ = served
    before = book.spent("alice", "corpus").epsilon
    response = _post(server, "/answer", keys["alice"], {"question": questions(world)[0]})
    assert response.status_code == 200, response.text
    answer = response.json()["answer"]
    assert answer["epsilon"] <= 1.0 + 1e-9 and [c["stage"] for c in answer["charges"]] == [
        "retrieval",
        "tokens",
    ]
    charges = book.charges("alice", "corpus")
    assert {c.ref.split("/")[0] for c in charges[-2:]} == {answer["ref"]}
    budget = httpx.get(server.url + "/budget", headers=bearer(keys["alice"])).json()
    assert budget["epsilon_cap"] == 3.0 and budget["delta_cap"] == 1e-5
    assert budget["spent_epsilon"] > before
    assert budget["remaining_epsilon"] == pytest.approx(answer["remaining_epsilon"])
    assert [c["stage"] for c in budget["charges"][-2:]] == ["rag-retrieval", "rag-tokens"]
    assert set(budget["by_stage"]) == {"rag-retrieval", "rag-tokens"}
    assert response.headers["Cache-Control"] == "no-store"


def test_retrieve_is_free(served, world):
    server, keys, book, _ = served
    before = len(_all_charges(book))
    response = _post(server, "/retrieve", keys["carol"], {"question": questions(world)[1], "k": 3})
    assert response.status_code == 200
    results = response.json()["results"]
    assert len(results) == 3 and all(r["doc_id"].startswith("rec-") for r in results)
    public_ids = {line.split('"')[3] for line in world["public_corpus"].read_text().splitlines()}
    assert {r["doc_id"] for r in results} <= public_ids  # the public index, never the private
    assert len(_all_charges(book)) == before


REFUSALS = [
    # (key, body, status, error)
    (None, {"question": "q"}, 401, "unauthorized"),
    ("not-a-key", {"question": "q"}, 401, "unauthorized"),
    ("dpk_0000000000000000_" + "A" * 43, {"question": "q"}, 401, "unauthorized"),
    ("wrong-secret", {"question": "q"}, 403, "forbidden"),
    ("dave", {"question": "q"}, 403, "forbidden"),  # revoked
    ("alice", {"question": "   "}, 400, "empty_question"),
    ("alice", {"epsilon": 1.0}, 400, "invalid_question"),  # missing
    ("alice", {"question": 42}, 400, "invalid_question"),  # the wrong type
    ("alice", {"question": "x" * 1001}, 413, "question_too_long"),
    ("alice", {"question": "q", "epsilon": "1"}, 400, "bad_epsilon"),
    ("alice", {"question": "q", "epsilon": 10**400}, 400, "bad_epsilon"),
    ("alice", {"question": "q", "epsilon": 0.5}, 400, "epsilon_not_offered"),
    ("alice", {"question": "q", "epsilon": 50.0}, 400, "epsilon_not_offered"),
    ("alice", {"question": "q", "mechanism": "keywords"}, 400, "mechanism_not_offered"),
    ("alice", ["not", "an", "object"], 400, "bad_request"),
    ("alice", {"question": "q", "pad": "x" * 70000}, 413, "body_too_large"),
]


@pytest.mark.parametrize(("who", "body", "status", "error"), REFUSALS)
def test_refusals_charge_nothing(served, who, body, status, error):
    server, keys, book, _ = served
    if who == "wrong-secret":
        key = keys["alice"][:-4] + ("AAAA" if not keys["alice"].endswith("AAAA") else "BBBB")
    else:
        key = keys.get(who, who)
    before = _all_charges(book)
    response = _post(server, "/answer", key, body)
    assert response.status_code == status, response.text
    assert response.json()["error"] == error and response.json()["request_id"]
    assert _all_charges(book) == before


def test_non_json_body(served):
    server, keys, *_ = served
    for raw in (b"question=q", b'{"question": "which dis'):  # not JSON; truncated JSON
        response = httpx.post(
            server.url + "/answer", headers=bearer(keys["alice"]), content=raw, timeout=30
        )
        assert response.status_code == 400 and response.json()["error"] == "invalid_json"
        assert "character" in response.json()["detail"]


def _answer(server, key, question):
    return _post(server, "/answer", key, {"question": question})


def test_exhausted_tenant_and_collection(served, world):
    server, keys, book, _ = served
    question = questions(world)[2]
    # bob's cap 1.5 holds one answer (1.0); the next is refused with the remaining budget
    assert _answer(server, keys["bob"], question).is_success
    before = _all_charges(book)
    refused = _answer(server, keys["bob"], question)
    assert refused.status_code == 402 and refused.json()["error"] == "epsilon_above_remaining"
    remaining = book.spent("bob", "corpus").epsilon_remaining
    assert refused.json()["remaining_epsilon"] == pytest.approx(remaining)
    assert 0.4 < remaining < 1.0
    # erin's cap 1.0 holds exactly one answer; then her budget is named exhausted
    assert _answer(server, keys["erin"], question).is_success
    refused = _answer(server, keys["erin"], question)
    assert refused.status_code == 402 and refused.json()["error"] == "budget_exhausted"
    assert refused.json()["remaining_epsilon"] < 0.01
    assert _all_charges(book)[len(before) :] == book.charges("erin", "corpus")
    # alice answers until the collection's cap (over all tenants) refuses what her own allows
    worst = plan_answer(SERVED, "icl", 1.0).worst_case_event()
    for _ in range(3):
        try:
            book.check("alice", "corpus", stage="x", event=worst, relation=RELATION, delta=1e-6)
        except BudgetExceededError as refusal:
            assert refusal.tenant == COLLECTION  # alice's own cap would allow it
            break
        assert _answer(server, keys["alice"], question).is_success
    else:
        raise AssertionError("the collection cap never bound")
    before = _all_charges(book)
    refused = _answer(server, keys["alice"], question)
    assert refused.status_code == 402 and refused.json()["error"] == "collection_budget_exhausted"
    assert _all_charges(book) == before
    assert book.spent(COLLECTION, "corpus").epsilon <= COLLECTION_CAP


def test_keys_are_stored_hashed(served):
    _, keys, book, root = served
    raw = (root / "ledger.sqlite").read_bytes()
    secrets = [key.split("_", 2)[2] for key in keys.values()]
    assert all(s.encode() not in raw for s in secrets)
    with sqlite3.connect(root / "ledger.sqlite") as conn:
        rows = conn.execute("SELECT name, key_hash FROM tenants").fetchall()
    assert {name for name, _ in rows} == set(CAPS)
    assert all(len(h) == 64 and h not in keys.values() for _, h in rows)
    listed = cli("tenant", "list", "--ledger", root / "ledger.sqlite").stdout
    assert "revoked" in listed and not any(s in listed for s in secrets)


def test_logs_hold_no_private_text(served, world):
    server, keys, _, root = served
    log = server.log.read_text()
    assert "request_id=" in log and "tenant=alice" in log and "status=402" in log
    private = [line for line in world["private_corpus"].read_text().splitlines()]
    doc_ids = [line.split('"')[3] for line in private]
    texts = [line.split('"text": "')[1][:40] for line in private]
    secrets = [k.split("_", 2)[2] for k in keys.values()]
    forbidden = questions(world)[:3] + doc_ids + texts + secrets
    leaked = [s for s in forbidden if s in log]
    assert not leaked, f"{len(leaked)} private strings in the server log"


def test_a_body_without_length_is_refused_unread(served):
    server, keys, book, _ = served
    before = _all_charges(book)
    response = httpx.post(
        server.url + "/answer",
        headers=bearer(keys["alice"]),
        content=iter([b'{"question": "q"}']),  # chunked: no Content-Length
        timeout=30,
    )
    assert response.status_code == 411 and response.json()["error"] == "length_required"
    assert _all_charges(book) == before


def _budget(server, key):
    response = httpx.get(server.url + "/budget", headers=bearer(key), timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def _is_error(response, status, error):
    """`response` is the documented error: status, {error, detail, request_id}, headers."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == error and isinstance(body["detail"], str) and body["detail"]
    assert body["request_id"] and response.headers["X-Request-Id"] == body["request_id"]
    assert response.headers["Cache-Control"] == "no-store"
    return body


def test_a_question_long_in_tokens_is_refused_before_any_charge(served):
    """100 emoji are 100 characters (under the 1000-character limit) but 400 tokens of the
    byte-level test LM (over the default 128): refused 413 before queueing, nothing charged."""
    server, keys, book, _ = served
    before, charges = _budget(server, keys["carol"]), _all_charges(book)
    response = _post(server, "/answer", keys["carol"], {"question": "\N{GRINNING FACE}" * 100})
    body = _is_error(response, 413, "question_too_long")
    assert "128 tokens" in body["detail"] and body["max_question_tokens"] == 128
    assert _budget(server, keys["carol"]) == before and _all_charges(book) == charges
    # the character limit still answers first, unread by the tokenizer
    response = _post(server, "/answer", keys["carol"], {"question": "x" * 1001})
    assert "1000 characters" in _is_error(response, 413, "question_too_long")["detail"]


@pytest.mark.parametrize("path", ["/answer", "/retrieve"])
@pytest.mark.parametrize(
    "raw",
    [
        b'{"question": "x \\ud800 y"}',  # a lone surrogate escape
        b'{"question": "x \\udfff\\ud800 y"}',  # a reversed pair: two lone surrogates
        b'{"question": "x y", "k": 3, "\\ud800": 1}',  # in a key
        b'{"question": "x \xed\xa0\x80 y"}',  # the surrogate's UTF-8 form: not UTF-8
    ],
)
def test_text_that_is_not_unicode_is_400(served, path, raw):
    server, keys, book, _ = served
    before = _all_charges(book)
    response = httpx.post(
        server.url + path,
        headers={**bearer(keys["carol"]), "Content-Type": "application/json"},
        content=raw,
        timeout=60,
    )
    _is_error(response, 400, "invalid_utf8" if b"\xed" in raw else "bad_request")
    assert _all_charges(book) == before


def test_a_valid_surrogate_pair_is_text(served):
    server, keys, *_ = served
    body = b'{"question": "which disease \\ud83d\\ude00?", "k": 2}'
    response = httpx.post(
        server.url + "/retrieve",
        headers={**bearer(keys["carol"]), "Content-Type": "application/json"},
        content=body,
        timeout=60,
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("path", "body", "unknown"),
    [
        ("/answer", {"question": "q", "k": 3}, ["k"]),
        (
            "/answer",
            {"question": "q", "tenant": "bob", "temperature": 0.0, "max_tokens": 99, "k": 3},
            ["k", "max_tokens", "temperature", "tenant"],
        ),
        ("/retrieve", {"question": "q", "k": 3, "epsilon": 1.0}, ["epsilon"]),
        (
            "/retrieve",
            {"question": "q", "mechanism": "icl", "Question": "q"},
            ["Question", "mechanism"],
        ),
    ],
)
def test_unknown_fields_are_refused(served, path, body, unknown):
    server, keys, book, _ = served
    before = _all_charges(book)
    refused = _is_error(_post(server, path, keys["carol"], body), 400, "unknown_fields")
    assert refused["fields"] == unknown
    assert f"unknown fields: {', '.join(unknown)} " in refused["detail"]
    assert _all_charges(book) == before


def test_every_error_has_the_documented_shape(served):
    server, *_ = served
    _is_error(httpx.get(server.url + "/nope", timeout=30), 404, "not_found")
    _is_error(httpx.post(server.url + "/budget", timeout=30), 405, "method_not_allowed")
    response = httpx.get(server.url + "/answer", timeout=30)
    assert "POST" in _is_error(response, 405, "method_not_allowed")["detail"]
    assert response.headers["Allow"] == "POST"


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "BeArEr"])
def test_the_auth_scheme_is_case_insensitive(served, scheme):
    server, keys, *_ = served
    headers = {"Authorization": f"{scheme}  {keys['carol']}"}
    budget = httpx.get(server.url + "/budget", headers=headers, timeout=30)
    assert budget.status_code == 200, budget.text
    assert budget.json()["tenant"] == "carol"
    retrieved = httpx.post(
        server.url + "/retrieve", headers=headers, json={"question": "q", "k": 1}, timeout=30
    )
    assert retrieved.status_code == 200, retrieved.text
    refused = httpx.get(server.url + "/budget", headers={"Authorization": f"Basic {keys['carol']}"})
    _is_error(refused, 401, "unauthorized")


def test_health_states_terms_to_tenants_only_and_no_queue_depth(served):
    server, keys, *_ = served
    for headers in ({}, bearer("not-a-key"), bearer(keys["dave"])):  # none, bad, revoked
        response = httpx.get(server.url + "/health", headers=headers, timeout=30)
        assert response.status_code == 200 and response.json() == {"status": "ok"}
    health = httpx.get(server.url + "/health", headers=bearer(keys["carol"]), timeout=30).json()
    assert health["status"] == "ok" and health["answer"] is True and health["replicas"] == 1
    assert health["max_question_tokens"] == 128 and health["max_question_chars"] == 1000
    assert health["answer_epsilon"] == 1.0 and health["mechanism"] == "icl"
    assert health["queue_capacity"] == 16 and health["answer_timeout"] == 120.0
    assert not {"busy", "waiting"} & set(health)  # the queue's depth times others' answers


@pytest.mark.parametrize("mechanism", ["vote", "sparse-vote", "answer-vote"])
def test_a_service_refuses_a_retired_mechanism_with_what_to_use(mechanism):
    from dpsynth.service.app import ServiceConfig

    with pytest.raises(ValueError, match=f"the {mechanism} mechanism was retired.*use facts"):
        ServiceConfig(mechanism=mechanism)
    assert ServiceConfig(mechanism="facts").mechanism == "facts"
