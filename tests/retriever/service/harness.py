"""A fictional private collection, tenants, and `retriever serve` run as a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

TIMEOUT = 120.0  # seconds a server may take to start (jax import, encoder load)


def cli(*args: object, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m retriever.cli ARGS` as a user runs it."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "retriever.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"retriever {args[:2]} failed: {result.stderr}")
    return result


def make_world(root: Path) -> dict[str, Path]:
    """A private medical collection and a public one, each with an exact index."""
    paths = {}
    for name, seed, records in (("private", 0, 40), ("public", 7, 30)):
        out = root / name
        subprocess.run(
            [sys.executable, "-m", "retriever.rag.medical", "--out", str(out),
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
            sys.executable, "-m", "retriever.cli", "serve",
            "--index", world["private_index"], "--private-corpus", world["private_corpus"],
            "--public-index", world["public_index"], "--public-corpus", world["public_corpus"],
            "--ledger", ledger, "--lm", "tiny", "--k", "4", "--max-tokens", "6",
            "--min-score", "0.2", *extra,
        ]  # fmt: skip
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> Server:
        env = {**os.environ, "HF_DATASETS_OFFLINE": "1"}
        self.stderr = open(self.log, "a")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            list(map(str, self.args)),
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
        )
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


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
