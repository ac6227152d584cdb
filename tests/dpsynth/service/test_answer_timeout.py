"""An answer's wall time is bounded: past `ServiceConfig.answer_timeout` it comes back
truncated, charged as usual (the charge precedes any release)."""

import httpx
import pytest

from dpsynth.service.app import Service, ServiceConfig
from tests.dpsynth.service.harness import bearer, serve_in_thread, tiny_rag


def _answer(book, registry, key, config):
    rag = tiny_rag(book, "records", max_tokens=8)
    with serve_in_thread(Service(book, registry, "records", [rag], None, config)) as url:
        response = httpx.post(
            url + "/answer", headers=bearer(key), json={"question": "what colour?"}, timeout=60
        )
    assert response.status_code == 200, response.text
    return response.json()["answer"]


@pytest.mark.parametrize(("timeout", "truncated"), [(1e-6, True), (120.0, False)])
def test_an_answer_past_its_timeout_is_truncated_and_charged(alice_ledger, timeout, truncated):
    book, registry, key = alice_ledger
    answer = _answer(book, registry, key, ServiceConfig(answer_timeout=timeout))
    assert answer["truncated"] is truncated
    if truncated:
        assert answer["tokens"] < 8
    charged = [c for c in book.charges("alice", "records") if c.ref.startswith(answer["ref"])]
    assert [c.stage for c in charged] == ["rag-retrieval", "rag-tokens"]  # as every answer
    assert sum(c.epsilon for c in charged) == pytest.approx(
        sum(c["epsilon"] for c in answer["charges"])
    )


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_answer_timeout_must_be_positive_and_finite(bad):
    with pytest.raises(ValueError, match="answer_timeout"):
        ServiceConfig(answer_timeout=bad)


def test_max_question_tokens_must_be_positive():
    with pytest.raises(ValueError, match="limits"):
        ServiceConfig(max_question_tokens=0)
