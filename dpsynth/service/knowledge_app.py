"""The HTTP service over a knowledge release (`retriever serve --knowledge DIR`).

Endpoints: ``POST /answer`` {"question"} (ordinary RAG over the release; the reply says
``"charged": false``; the body is parsed and refused exactly as by `retriever serve`: JSON
whatever the Content-Type, unknown fields named), ``GET /budget`` (what an answer costs:
nothing, and why), ``GET /card`` (the release's card), ``GET /health`` and ``GET /`` (a
page to ask questions). No tenant key is needed: nothing private is read, so there is no
budget to protect.

Privacy:
  Serves post-processing of a DP release only: the collection was released once at the
  card's (epsilon, delta) per record, and no answer reads the private collection or spends
  budget. Logs hold counts and timings, never a question or an answer.
"""

from __future__ import annotations

import html
import logging
import threading
import time

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dpsynth.service.app import ServiceConfig
from dpsynth.service.responses import (
    framework_error,
    guarded,
    read_json_body,
    read_question,
)
from retriever.knowledge_base import KnowledgeBase

log = logging.getLogger("dpsynth.service.knowledge")
LIMITS = ServiceConfig()  # the same body and question limits as `retriever serve`


def budget_statement(base: KnowledgeBase) -> dict:
    """What an answer costs (nothing) and the release's guarantee."""
    g = base.card["guarantee"]
    return {
        "charged_per_answer": {"epsilon": 0.0, "delta": 0.0},
        "mode": "release",
        "guarantee": g,
        "statement": (
            f"Answers cost nothing: the collection was released once at "
            f"({g['epsilon']:.4g}, {g['delta']:.3g})-DP per record, and every answer reads "
            "only that release. " + base.statement
        ),
    }


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Knowledge release</title>
<style>body{{font-family:sans-serif;max-width:46em;margin:2em auto}}
#answer{{white-space:pre-wrap;border:1px solid #ccc;padding:.6em;min-height:2em}}
.note{{color:#333;background:#eef6ee;padding:.6em}}</style></head><body>
<h1>Ask the released knowledge</h1>
<p class="note" id="budget">{statement}</p>
<form id="ask"><input id="q" size="60" placeholder="Which disease causes ...?">
<button>Ask</button></form>
<p id="answer"></p>
<script>
document.getElementById('ask').onsubmit = async (e) => {{
  e.preventDefault();
  const r = await fetch('/answer', {{method: 'POST', headers: {{'content-type':
    'application/json'}}, body: JSON.stringify({{question: document.getElementById('q').value}})}});
  const body = await r.json();
  document.getElementById('answer').textContent = r.ok
    ? body.answer + '\\n(charged: ' + body.charged + ')' : 'error: ' + JSON.stringify(body);
}};
</script></body></html>
"""


def create_knowledge_app(base: KnowledgeBase) -> FastAPI:
    """The FastAPI app answering from `base` (one answer at a time: one model)."""
    app = FastAPI(
        title="dpsynth knowledge release", docs_url=None, redoc_url=None, openapi_url=None
    )
    for kind in (StarletteHTTPException, RequestValidationError, Exception):
        app.add_exception_handler(kind, framework_error)
    lock = threading.Lock()

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "records": len(base.records)}

    @app.get("/card")
    def card() -> dict:
        return base.card

    @app.get("/budget")
    def budget() -> dict:
        return budget_statement(base)

    @app.get("/", response_class=HTMLResponse)
    def page() -> str:
        return _PAGE.format(statement=html.escape(budget_statement(base)["statement"]))

    def answer_locked(question: str) -> dict:
        start = time.perf_counter()
        with lock:
            result = base.answer(question).to_dict()
        log.info("answer: %d sources, %.2f s", len(result["sources"]), time.perf_counter() - start)
        return result

    @app.post("/answer")
    @guarded
    async def answer(request: Request) -> dict:
        # the body parsing and refusals of `retriever serve` (one parser, the same errors)
        body = await read_json_body(request, frozenset({"question"}), LIMITS.max_body_bytes)
        question = read_question(body, LIMITS.max_question_chars)
        return await run_in_threadpool(answer_locked, question)

    return app


def serve_knowledge(base: KnowledgeBase, *, host: str = "127.0.0.1", port: int = 0) -> None:
    """Serves until interrupted; prints ``serving http://HOST:PORT`` once listening."""
    import os

    import uvicorn

    from dpsynth.service.server import bind

    sock = bind(host, port)
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        create_knowledge_app(base), log_config=None, log_level="warning", access_log=False
    )
    print(f"serving http://{host}:{bound} (pid {os.getpid()})", flush=True)
    uvicorn.Server(config).run(sockets=[sock])
