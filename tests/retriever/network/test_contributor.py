"""`retriever contributor serve` as real processes: keys, the card, free synthetic retrieval,
/answer only where served, each contributor on its own ledger."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from dpsynth.service.contributor import add_key, load_contributor
from retriever.network.folder import read_card
from synthgen.privacy import COLLECTION, PrivacyLedger
from tests.dpsynth.service.harness import bearer
from tests.retriever.network.harness import (
    ANSWER_EPSILON,
    DATASET,
    ENCODER,
    SYNTHETIC,
    make_contributor,
    questions,
)


def _retrieve(url: str, key: str | None, question: str, k: int = 3) -> httpx.Response:
    headers = bearer(key) if key is not None else {}
    return httpx.post(
        url + "/retrieve", headers=headers, json={"question": question, "k": k}, timeout=30
    )


def _answer(network, server: str, holder: str, question: str) -> httpx.Response:
    """POST /answer at `server`'s contributor with the key issued by `holder`'s."""
    return httpx.post(
        network.url(server) + "/answer",
        headers=bearer(network.keys[holder]),
        json={"question": question},
        timeout=60,
    )


def _charges(network, name: str) -> list:
    return PrivacyLedger(str(network.folders[name].ledger)).charges(COLLECTION, DATASET)


@pytest.mark.parametrize("name", ["north", "south"])
def test_card_is_public_and_is_the_folders(network, name):
    response = httpx.get(network.url(name) + "/card", timeout=30)  # no key
    assert response.status_code == 200
    card = response.json()
    serves = card.pop("serves")
    assert card == read_card(network.folders[name].release)
    assert serves["retrieve"] is True and serves["retrieve_epsilon"] == 0.0
    if name == "north":
        assert serves["answer"]["epsilon"] == ANSWER_EPSILON
        assert serves["answer"]["mechanism"] == "icl"
        assert serves["answer"]["neighboring_relation"] == "ADD_OR_REMOVE_ONE"
    else:
        assert serves["answer"] is None


def _wrong_secret(key: str) -> str:
    return key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")


@pytest.mark.parametrize(
    ("key", "status"),
    [
        (None, 401),
        ("not-a-key", 401),
        ("dpk_0000000000000000_" + "A" * 43, 401),
        ("wrong-secret", 403),
    ],
)
def test_retrieve_needs_a_valid_key(network, key, status):
    if key == "wrong-secret":
        key = _wrong_secret(network.keys["south"])
    response = _retrieve(network.url("south"), key, "fever")
    assert response.status_code == status
    assert response.json()["error"] in {"unauthorized", "forbidden"}
    assert "results" not in response.json()


def test_a_key_of_one_contributor_is_refused_at_another(network, world_question):
    for holder, server in [("north", "south"), ("south", "east"), ("east", "north")]:
        foreign = network.keys[holder]
        response = _retrieve(network.url(server), foreign, world_question)
        assert response.status_code == 401, (holder, server)
        assert response.json()["error"] == "unauthorized"
        assert _retrieve(network.url(holder), foreign, world_question).status_code == 200
    before = _charges(network, "north")
    answer = _answer(network, "north", "south", world_question)
    assert answer.status_code == 401 and _charges(network, "north") == before


@pytest.fixture
def world_question(network) -> str:
    return questions(network.world)[0]


def test_retrieve_is_free_and_returns_only_synthetic_documents(network, world_question):
    from retriever.evaluate import load_towers

    private = {
        json.loads(line)["doc_id"]: json.loads(line)["text"]
        for line in network.world["private_corpus"].read_text().splitlines()
    }
    encoder, _ = load_towers(ENCODER)
    for name in ("north", "south", "east"):
        synthetic = network.folders[name].synthetic()
        before = _charges(network, name)
        response = _retrieve(network.url(name), network.keys[name], world_question, k=4)
        assert response.status_code == 200
        body = response.json()
        assert body["epsilon"] == 0.0 and len(body["results"]) == 4
        for result in body["results"]:
            assert synthetic[result["doc_id"]] == result["text"]
            assert result["doc_id"] not in private and result["text"] not in private.values()
        # the exact oracle: inner products of the question with every synthetic document
        scores = encoder.encode(list(synthetic.values())) @ encoder.encode([world_question])[0]
        best = np.argsort(-scores)[:4]
        np.testing.assert_allclose(
            [r["score"] for r in body["results"]], scores[best], rtol=1e-4, atol=1e-5
        )
        assert _charges(network, name) == before  # nothing charged, however often asked


def test_answer_is_served_only_where_offered(network, world_question):
    south_before = _charges(network, "south")
    refused = _answer(network, "south", "south", world_question)
    assert refused.status_code == 404 and refused.json()["error"] == "answer_not_served"
    health = httpx.get(
        network.url("south") + "/health", headers=bearer(network.keys["south"]), timeout=30
    ).json()
    assert health["answer"] is False and health["replicas"] == 0 and health["retrieve"] is True
    assert _charges(network, "south") == south_before

    north_before = _charges(network, "north")
    answered = _answer(network, "north", "north", world_question)
    assert answered.status_code == 200, answered.text
    answer = answered.json()["answer"]
    assert answer["epsilon"] <= ANSWER_EPSILON + 1e-9
    new = _charges(network, "north")[len(north_before) :]
    assert {c.ref.split("/")[0] for c in new} == {answer["ref"]}  # charged at north only
    assert _charges(network, "south") == south_before


def test_load_contributor_without_answer_needs_no_cap(network, tmp_path):
    folders = make_contributor(tmp_path, "west", network.world, documents=SYNTHETIC["south"])
    service = load_contributor(folders.release, folders.work)  # a fresh ledger: no cap
    assert service.replicas == [] and service.admission is None
    assert service.card["contributor"] == "west" and service.card["serves"]["answer"] is None
    assert service.dataset == DATASET and service.public is not None
    with pytest.raises(ValueError, match="no exact private index"):
        load_contributor(folders.release, folders.work, answer=True, lm="tiny")
    with pytest.raises(FileNotFoundError, match="private.json"):
        load_contributor(folders.release, tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="collection cap"):
        add_key(folders.work, "first", epsilon=1.0, delta=1e-6)
    key = add_key(
        folders.work, "first", epsilon=1.0, delta=1e-6, collection_epsilon=2.0,
        collection_delta=1e-6,
    )  # fmt: skip
    assert service.registry.authenticate(key).name == "first"


def test_a_service_without_card_replicas_or_index_serves_health_only(tmp_path):
    from fastapi.testclient import TestClient

    from dpsynth.service.app import Service, create_app
    from dpsynth.service.tenants import TenantRegistry

    ledger = PrivacyLedger(str(tmp_path / "ledger.sqlite"))
    registry = TenantRegistry(ledger)
    key = registry.add(
        "t", DATASET, epsilon=1.0, delta=1e-6, collection_epsilon=1.0, collection_delta=1e-6
    )
    with TestClient(create_app(Service(ledger, registry, DATASET, []))) as client:
        assert client.get("/health").json() == {"status": "ok"}  # no key: liveness only
        health = client.get("/health", headers=bearer(key)).json()
        assert health["answer"] is False and health["answer_epsilon"] is None
        assert client.get("/card").status_code == 404
        assert client.get("/card").json()["error"] == "no_card"
        answer = client.post("/answer", headers=bearer(key), json={"question": "q"})
        assert answer.status_code == 404 and answer.json()["error"] == "answer_not_served"
        assert client.post("/answer", json={"question": "q"}).status_code == 401  # key first
        budget = client.get("/budget", headers=bearer(key)).json()
        assert budget["tenant"] == "t" and budget["spent_epsilon"] == 0.0
