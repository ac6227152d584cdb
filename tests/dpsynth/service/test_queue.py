"""The bounded queue in front of the model replica, over real HTTP (uvicorn in a thread):
503 with Retry-After when full or timed out, nothing charged, one answer at a time."""

import asyncio
import threading
import time

import httpx
import pytest

from dpsynth.service.admission import Admission, QueueFullError, QueueTimeoutError
from dpsynth.service.app import Service, ServiceConfig
from synthgen.lm_backends import TinyLM
from synthgen.privacy import COLLECTION
from tests.dpsynth.service.harness import bearer, serve_in_thread, tiny_rag


class GatedLM(TinyLM):
    """TinyLM whose private session waits for `gate` (the answer is already charged)."""

    def __init__(self, gate, started):
        super().__init__()
        self.gate, self.started = gate, started

    def fork(self):
        return TinyLM()  # the public prompt's session is not gated

    def start(self, prompts, max_new_tokens, **kw):
        self.started.set()
        assert self.gate.wait(60)
        return super().start(prompts, max_new_tokens, **kw)


@pytest.fixture
def gated_server(alice_ledger):
    book, registry, key = alice_ledger
    gate, started = threading.Event(), threading.Event()
    rag = tiny_rag(book, "records", GatedLM(gate, started))
    service = Service(
        book, registry, "records", [rag], None, ServiceConfig(queue_capacity=1, queue_timeout=1.0)
    )
    with serve_in_thread(service) as url:
        yield url, key, book, gate, started, service.admission
        gate.set()


def _ask(url, key, results, name):
    response = httpx.post(
        url + "/answer",
        headers=bearer(key),
        json={"question": "what colour?", "epsilon": 1.0},
        timeout=60,
    )
    results[name] = response


def _wait(predicate, timeout=30):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_full_queue_and_queue_timeout_are_503_and_free(gated_server):
    url, key, book, gate, started, admission = gated_server
    results = {}
    first = threading.Thread(target=_ask, args=(url, key, results, "first"))
    first.start()
    assert started.wait(30)  # the replica holds the first answer (charged, then gated)
    charged = book.charges(COLLECTION, "records")
    assert len(charged) == 2
    second = threading.Thread(target=_ask, args=(url, key, results, "second"))
    second.start()
    _wait(lambda: admission.waiting == 1)  # not on /health: a timing side channel
    _ask(url, key, results, "third")  # queue capacity 1: full
    assert results["third"].status_code == 503
    assert results["third"].json()["error"] == "queue_full"
    assert int(results["third"].headers["Retry-After"]) >= 1
    second.join(30)  # waits 1 s for the replica, then gives up
    assert results["second"].status_code == 503
    assert results["second"].json()["error"] == "queue_timeout"
    assert "Retry-After" in results["second"].headers
    assert book.charges(COLLECTION, "records") == charged  # the refusals cost nothing
    gate.set()
    first.join(30)
    assert results["first"].status_code == 200
    _wait(lambda: admission.busy == 0)  # the replica is back


def test_admission_returns_the_replica_after_a_cancelled_request():
    async def until(predicate):
        for _ in range(5000):
            if predicate():
                return
            await asyncio.sleep(0.002)
        raise AssertionError("timed out")

    async def hold_and_refuse(admission, error):
        """Holds the one replica with an answer that waits for the returned event; the next
        request must fail with `error`. Returns (the held answer's task, its event)."""
        release = threading.Event()
        task = asyncio.ensure_future(admission.run(lambda r: release.wait(10)))
        await until(lambda: admission.busy == 1)
        with pytest.raises(error):
            await admission.run(lambda r: r)
        return task, release

    async def scenario():
        admission = Admission(["r0"], capacity=0, timeout=5.0)
        task, release = await hold_and_refuse(admission, QueueFullError)
        task.cancel()  # the client went away; the answer still runs to its end
        await until(task.done)
        assert admission.busy == 1  # not handed out while the answer runs
        release.set()
        await until(lambda: admission.busy == 0)
        assert await admission.run(lambda r: r) == "r0"
        short = Admission(["r0"], capacity=1, timeout=0.05)
        holder, hold = await hold_and_refuse(short, QueueTimeoutError)
        hold.set()
        await holder
        admission.close()
        short.close()

    asyncio.run(scenario())
