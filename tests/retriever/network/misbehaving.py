"""A misbehaving network contributor: a real HTTP server whose replies break the protocol.

Run as a script (``python misbehaving.py``); it binds a free loopback port and prints
``serving http://127.0.0.1:PORT`` like `retriever contributor serve`. Each behaviour lives
under its own prefix, so ``http://127.0.0.1:PORT/<behaviour>`` is one contributor URL:

  ok                 a valid /retrieve reply (two documents)
  hang               accepts the request and never answers
  stall              sends the headers and the start of a body, then nothing
  not-json           an HTML page with status 200
  wrong-schema       a JSON object without "results"
  nan-score          a result whose score is NaN
  too-many           50 results whatever k was asked
  costly             valid results that claim to cost epsilon 0.5
  oversize           a 10 MB body streamed without Content-Length
  oversize-declared  a 10 MB body with its Content-Length
  flaky-<id>         503 with Retry-After: 1 on the first request, then a valid reply
  busy               always 503 with Retry-After: 3600
  broken             always 500
  forbidden          always 403

``GET /<behaviour>/log`` lists the (monotonic) times of the requests that path received.
Only the test harness uses it; it stands for a contributor that is buggy or hostile.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import defaultdict

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

TEN_MB = 10 * 1024 * 1024
CHUNK = 64 * 1024


def _results(n: int) -> list[dict]:
    return [
        {"doc_id": f"bad-{i}", "text": f"document {i}", "score": 1.0 - i / 100} for i in range(n)
    ]


def create_app() -> FastAPI:
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    seen: dict[str, list[float]] = defaultdict(list)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/{behaviour}/log")
    async def request_log(behaviour: str) -> dict:
        return {"times": seen[behaviour]}

    @app.post("/{behaviour}/retrieve")
    async def retrieve(behaviour: str, request: Request) -> Response:
        seen[behaviour].append(time.monotonic())
        body = await request.body()
        k = json.loads(body or b"{}").get("k", 5)
        if behaviour == "ok":
            return JSONResponse({"results": _results(min(2, k)), "epsilon": 0.0})
        if behaviour == "hang":
            await asyncio.Event().wait()
        if behaviour == "stall":

            async def stall():
                yield b'{"results": ['
                await asyncio.Event().wait()

            return StreamingResponse(stall(), media_type="application/json")
        if behaviour == "not-json":
            return PlainTextResponse("<html><body>It works!</body></html>")
        if behaviour == "wrong-schema":
            return JSONResponse({"hits": _results(1), "epsilon": 0.0})
        if behaviour == "nan-score":
            content = '{"results": [{"doc_id": "a", "text": "t", "score": NaN}], "epsilon": 0.0}'
            return Response(content, media_type="application/json")
        if behaviour == "too-many":
            return JSONResponse({"results": _results(50), "epsilon": 0.0})
        if behaviour == "costly":
            return JSONResponse({"results": _results(1), "epsilon": 0.5})
        if behaviour == "oversize":

            async def flood():
                yield b'{"results": [], "epsilon": 0.0, "pad": "'
                for _ in range(TEN_MB // CHUNK):
                    yield b"x" * CHUNK
                yield b'"}'

            return StreamingResponse(flood(), media_type="application/json")
        if behaviour == "oversize-declared":
            pad = "x" * TEN_MB
            return Response(f'{{"results": [], "epsilon": 0.0, "pad": "{pad}"}}')
        if behaviour.startswith("flaky-"):
            if len(seen[behaviour]) == 1:
                return JSONResponse({"error": "queue_full"}, 503, headers={"Retry-After": "1"})
            return JSONResponse({"results": _results(min(2, k)), "epsilon": 0.0})
        if behaviour == "busy":
            return JSONResponse({"error": "queue_full"}, 503, headers={"Retry-After": "3600"})
        if behaviour == "broken":
            return JSONResponse({"error": "internal", "detail": "internal error"}, 500)
        if behaviour == "forbidden":
            return JSONResponse({"error": "forbidden", "detail": "invalid API key"}, 403)
        return JSONResponse({"error": "not_found"}, 404)

    return app


def main() -> None:
    import uvicorn

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    print(f"serving http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(create_app(), log_level="warning", timeout_graceful_shutdown=1)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
