"""A fictional private collection, tenants, and `retriever serve` run as a real process."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import cli_process
import httpx
import pytest

from synthgen.privacy.receipts import collection_payer

TIMEOUT = 120.0  # seconds a server may take to start (jax import, encoder load)


def cli(*args: object, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m dpsynth.cli.retriever ARGS` as a user runs it."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1"}
    result = cli_process.command("retriever", *args, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"retriever {args[:2]} failed: {result.stderr}")
    return result


def make_world(root: Path) -> dict[str, Path]:
    """A private medical collection and a public one, each with an exact index."""
    paths = {}
    for name, seed, records in (("private", 0, 40), ("public", 7, 30)):
        out = root / name
        cli_process.run(
            [sys.executable, "-m", "dpsynth.evaluation.medical_world", "--out", str(out),
             "--num-records", str(records), "--num-diseases", "5", "--seed", str(seed)],
            check=True, capture_output=True,
        )  # fmt: skip
        cli("index", "build", "--corpus", out / "corpus.jsonl", "--out", root / f"{name}-index",
            "--kind", "exact")  # fmt: skip
        paths[f"{name}_corpus"] = out / "corpus.jsonl"
        paths[f"{name}_index"] = root / f"{name}-index"
    paths["questions"] = root / "private" / "questions.jsonl"
    return paths


def questions(world: dict[str, Path]) -> list[str]:
    return [json.loads(line)["question"] for line in world["questions"].read_text().splitlines()]


def add_tenants(
    ledger: str, caps: dict[str, float], *, collection: float, delta: float = 1e-5
) -> dict[str, str]:
    """Registers tenants with `retriever tenant add`; returns their keys."""
    keys = {}
    for i, (name, cap) in enumerate(caps.items()):
        extra = ["--collection-epsilon", collection, "--collection-delta", delta] if i == 0 else []
        out = cli("tenant", "add", name, "--epsilon", cap, "--delta", delta, "--ledger", ledger,
                  "--dataset", "corpus", *extra)  # fmt: skip
        keys[name] = out.stdout.strip()
    return keys


class Server:
    """`retriever serve` in a child process on a loopback port it picks itself."""

    def __init__(self, world: dict[str, Path], ledger: str, log: Path, *extra: object) -> None:
        self.args = [
            sys.executable, "-m", "dpsynth.cli.retriever", "serve",
            "--index", world["private_index"], "--private-corpus", world["private_corpus"],
            "--public-index", world["public_index"], "--public-corpus", world["public_corpus"],
            "--ledger", ledger, "--lm", "tiny", "--k", "4", "--max-tokens", "6",
            "--min-score", "0.2", *extra,
        ]  # fmt: skip
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.url = ""

    cwd: Path | None = None  # the child's working folder (None: this process's)

    def start(self) -> Server:
        return self.launch().wait_ready()

    def launch(self) -> Server:
        """Starts the child; `wait_ready` waits for it, so several can start at once."""
        env = {**os.environ, "HF_DATASETS_OFFLINE": "1"}
        self.stderr = open(self.log, "a")  # noqa: SIM115 - closed in stop()/kill()
        self.proc = subprocess.Popen(
            list(map(str, self.args)),
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
            cwd=self.cwd,
        )
        return self

    def wait_ready(self) -> Server:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()))
        reader.start()
        reader.join(TIMEOUT)
        if not line or not line[0].startswith("serving "):
            self.kill()
            raise AssertionError(f"server did not start: {self.log.read_text()[-2000:]}")
        self.url = line[0].split()[1]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the socket listens before uvicorn accepts
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.05)
        raise AssertionError("server never answered /health")

    def kill(self) -> None:
        """SIGKILL: no shutdown handler runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self._close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._close()

    def _close(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        if getattr(self, "stderr", None) is not None:
            self.stderr.close()
            self.stderr = None


N_RECORDS = 16  # documents of `tiny_rag`'s collection


def tiny_rag(book, dataset: str, lm=None, **config):
    """A `DPRag` over 16 short records with random unit embeddings and `lm` (TinyLM)."""
    import numpy as np

    from retriever.rag import DPRag, PromptFormat, RagConfig, ScoreRange
    from synthgen.lm_backends import TinyLM

    rng = np.random.default_rng(0)
    emb = rng.normal(size=(N_RECORDS, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    config = {"k": 4, "max_tokens": 3, "score_range": ScoreRange(-1.0, 1.0), **config}
    return DPRag(
        [f"d{i}" for i in range(N_RECORDS)],
        [f"record {i} says blue" for i in range(N_RECORDS)],
        emb,
        lambda qs: emb[:1],
        lm if lm is not None else TinyLM(),
        payer=collection_payer(book, dataset),
        config=RagConfig(**config),
        prompt=PromptFormat(chat=False),
    )


@contextlib.contextmanager
def serve_in_thread(service) -> Iterator[str]:
    """`create_app(service)` under uvicorn in a thread on a loopback port; yields its URL."""
    import uvicorn

    from dpsynth.service.app import create_app
    from dpsynth.service.server import bind

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(service), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@dataclasses.dataclass
class Outcome:
    """One client request: the HTTP status (0: the connection failed) and what came back."""

    tenant: str
    status: int
    ref: str | None = None
    charges: tuple[float, ...] = ()
    error: str | None = None


def run_clients(
    urls: Callable[[int], str],
    keys: dict[str, str],
    question: str,
    *,
    clients: int = 50,
    requests_each: int = 5,
    epsilon: float = 0.3,
    deadline_s: float = 90.0,
    progress: Callable[[list[Outcome]], None] | None = None,
) -> list[Outcome]:
    """`clients` concurrent clients, client i a tenant in turn, each sending up to
    `requests_each` answers to ``urls(i)`` (re-read on every try, so a restarted server
    is found); a refused connection is retried until the deadline."""
    names = sorted(keys)
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + deadline_s

    def client(i: int) -> None:
        tenant = names[i % len(names)]
        with httpx.Client(timeout=60) as http:
            sent = 0
            while sent < requests_each and time.monotonic() < stop_at:
                try:
                    response = http.post(
                        urls(i) + "/answer",
                        headers=bearer(keys[tenant]),
                        json={"question": question, "epsilon": epsilon},
                    )
                except httpx.TransportError:
                    with lock:
                        outcomes.append(Outcome(tenant, 0))
                    time.sleep(0.1)  # the server is down: try again
                    continue
                sent += 1
                body = response.json()
                if response.status_code == 200:
                    answer = body["answer"]
                    outcome = Outcome(
                        tenant, 200, answer["ref"], tuple(c["epsilon"] for c in answer["charges"])
                    )
                else:
                    outcome = Outcome(tenant, response.status_code, error=body.get("error"))
                with lock:
                    outcomes.append(outcome)
                    if progress is not None:
                        progress(outcomes)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline_s + 60)
    return outcomes


def check_ledger_against_answers(book, outcomes: list[Outcome], caps: dict[str, float]):
    """Every returned answer's charges are in the ledger as returned; returns the refs the
    ledger holds that no client saw (answers lost in flight)."""
    from synthgen.privacy import COLLECTION

    by_ref: dict[str, list] = {}
    for charge in book.charges(COLLECTION, "corpus"):
        by_ref.setdefault(charge.ref.split("/")[0], []).append(charge)
    returned = {o.ref: o for o in outcomes if o.status == 200}
    for ref, outcome in returned.items():
        rows = by_ref.get(ref)
        assert rows is not None, "an answer was returned without its charge"
        assert {r.tenant for r in rows} == {outcome.tenant}
        assert tuple(r.epsilon for r in rows) == pytest.approx(outcome.charges)
    for tenant, cap in caps.items():
        spent = book.spent(tenant, "corpus").epsilon
        assert spent <= cap * (1 + 1e-9), f"{tenant} spent {spent} over its cap {cap}"
        check = book.verify(tenant, "corpus")
        assert check.best <= check.stated * (1 + 1e-6) + 1e-9  # the statement is sound
    return set(by_ref) - set(returned)
