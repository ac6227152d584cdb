"""The DP-RAG service guide's screenshot of `retriever serve`'s page (`docs/service_page.png`).

Builds a small fictional medical collection with an exact index, registers one tenant,
starts `retriever serve` with a real small LM, asks one question in headless Chromium
(the system's, no browser download) and saves a full-page screenshot. Everything but
the PNG lives in a temporary folder; the server is stopped at the end, also on error.

    PYTHONPATH=. .venv/bin/python scripts/service_screenshot.py [--out docs/service_page.png]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TENANT = "clinic-a"
START_TIMEOUT = 300.0  # seconds the server may take to load the encoder and the LM
ANSWER_TIMEOUT_MS = 180_000


def run(*args: object) -> str:
    """`python ARGS` with offline datasets; returns stdout, raises with stderr on failure."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, env=env
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args[:4]))} failed:\n{result.stderr[-3000:]}")
    return result.stdout


def build_world(root: Path, *, records: int, diseases: int) -> dict[str, Path]:
    """The fictional collection, its exact index, and its first question."""
    collection = root / "collection"
    run("-m", "dpsynth.evaluation.medical_world", "--out", collection, "--num-records", records,
        "--num-diseases", diseases)  # fmt: skip
    corpus = collection / "corpus.jsonl"
    run("-m", "dpsynth.cli.retriever", "index", "build", "--corpus", corpus,
        "--out", root / "index",
        "--kind", "exact")  # fmt: skip
    return {"corpus": corpus, "index": root / "index", "questions": collection / "questions.jsonl"}


def first_question(path: Path) -> str:
    return json.loads(path.read_text().splitlines()[0])["question"]


def add_tenant(ledger: Path, *, epsilon: float, collection_epsilon: float) -> str:
    """Registers the tenant (and the collection's caps); returns its API key."""
    out = run("-m", "dpsynth.cli.retriever", "tenant", "add", TENANT, "--epsilon", epsilon,
              "--delta", 1e-5, "--ledger", ledger, "--dataset", "corpus",
              "--collection-epsilon", collection_epsilon, "--collection-delta", 1e-5)  # fmt: skip
    return out.strip()


def start_server(
    world: dict[str, Path], ledger: Path, lm: str, epsilon: float, mechanism: str, log: Path
) -> tuple:
    """`retriever serve` on a free loopback port, at the service's defaults otherwise (as the
    service guide's first run); returns (process, url)."""
    args = [
        sys.executable, "-m", "dpsynth.cli.retriever", "serve",
        "--index", world["index"], "--private-corpus", world["corpus"], "--ledger", ledger,
        "--lm", lm, "--answer-epsilon", epsilon, "--mechanism", mechanism,
    ]  # fmt: skip
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1"}
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            list(map(str, args)), stdout=subprocess.PIPE, stderr=stderr, text=True, env=env
        )
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(START_TIMEOUT)
    if not line or not line[0].startswith("serving "):
        stop_server(proc)
        raise RuntimeError(f"server did not start:\n{log.read_text()[-3000:]}")
    return proc, line[0].split()[1]


def wait_healthy(url: str, timeout: float = 30.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # the socket listens before uvicorn accepts
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("server never answered /health")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    if proc.stdout is not None:
        proc.stdout.close()


def screenshot(url: str, key: str, question: str, out: Path) -> str:
    """Asks once on the page and saves it; returns the answer text shown."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise RuntimeError("no system Chromium on PATH (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 900, "height": 1000})
            page.goto(url + "/")
            page.fill("#key", key)
            page.dispatch_event("#key", "change")
            shown = "document.getElementById('remaining').textContent.startsWith('remaining')"
            page.wait_for_function(shown, timeout=60_000)
            page.fill("#question", question)
            page.click("#ask")  # body[data-busy] until the answer and the budget are shown
            page.wait_for_function("!document.body.dataset.busy", timeout=ANSWER_TIMEOUT_MS)
            error = page.locator("#error").inner_text()
            if error:
                raise RuntimeError(f"the page shows an error: {error}")
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out), full_page=True)
            return page.locator("#answer").inner_text()
        finally:
            browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/service_page.png"))
    parser.add_argument("--lm", default="smollm2-135m-instruct", help="LM asset or path")
    # the service guide's first run: its sample collection, mechanism, epsilon and question
    parser.add_argument("--epsilon", type=float, default=5.0, help="the service's answer epsilon")
    parser.add_argument("--mechanism", default="keywords", help="the service's mechanism")
    parser.add_argument("--num-records", type=int, default=2000)
    parser.add_argument("--num-diseases", type=int, default=60)
    parser.add_argument(
        "--question", default="Which disease causes zazelous flushing and nagrexal tremor?"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="service-screenshot-") as tmp:
        root = Path(tmp)
        world = build_world(root, records=args.num_records, diseases=args.num_diseases)
        ledger = root / "ledger.sqlite"
        key = add_tenant(ledger, epsilon=20.0, collection_epsilon=40.0)
        log = root / "server.log"
        proc, url = start_server(world, ledger, args.lm, args.epsilon, args.mechanism, log)
        try:
            wait_healthy(url)
            question = args.question or first_question(world["questions"])
            answer = screenshot(url, key, question, args.out)
        finally:
            stop_server(proc)
    print(f"question: {question}")
    print(f"answer:   {answer}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
