"""`NextTokenLM` over an OpenAI-compatible completions server (llama.cpp, vLLM).

Each prompt is sent to ``POST {base_url}/completions`` with ``max_tokens=1`` and
``logprobs=k``; the reply's top-k log-probabilities become a full-vocabulary vector.

`prepare` probes the server once with the public `PROBE_TEXT` (never a private prompt):
it settles the prompt format (token ids where accepted, else text, whose tokenisation is
checked against the local ids where the server has a tokenize endpoint) and refuses a
server that caps k; call it before the charge (the CLI does). The top-k log-probabilities
are kept and the residual mass 1 - sum(top-k) is spread uniformly over the other tokens;
servers keep no session, so every step re-sends prompt + generated tokens (prefix caching
makes this cheap). Prompt formats, concurrency, short replies and what is refused: see
docs/guides/byo.md#lm-server.

Privacy:
  The server sees the private prompts: self-host it where the private data may go, never
  a third-party API; the DP guarantee covers what is released from the generated tokens,
  not what the server logs. Each row comes from its own prompt's reply only and must be a
  probability distribution, as the sqrt(2)/M sensitivity of `synthgen.fewshot` needs (the
  mechanism also maps every row to the simplex, `synthgen.fewshot.mechanism.distributions`,
  so the guarantee never rests on the server); a reply that is not one is refused, not
  renormalised. A refusal mid-run stops the run with no output and the charge stands; since
  that stop depends on a reply to a private prompt, the public probe checks the server
  before the charge. Errors carry the status and the server's address, never a prompt, a
  reply or the server's error body (a server may echo the rejected prompt there).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from synthgen.next_token import RescoredSession

PROMPT_FORMATS = ("auto", "tokens", "text")
# Public and fixed: the only prompt the probe ever sends.
PROBE_TEXT = (
    "Here are paragraphs from encyclopedia articles about rivers.\n\n"
    "Paragraph: The Danube flows through ten countries, from the Black Forest to the "
    "Black Sea; its delta is a UNESCO site (1991).\n\nParagraph:"
)
RETRY_STATUS = frozenset({429, 503})
# A top-k mass or a log-prob this far above 1 or 0 is float rounding, not a broken row.
TOLERANCE = 1e-3
EMPTY_TOKEN = ""  # llama-cpp-python's name of every special or partial-UTF-8 token


class LMServerError(RuntimeError):
    """The LM server failed or sent a reply that is refused; one line, no private text."""


@dataclasses.dataclass(frozen=True)
class ServerCheck:
    """What `OpenAICompletionsLM.prepare` found with the public probe.

    Attributes:
      prompt_format: "tokens" or "text", what the private prompts will be sent as.
      tokenization: "exact" (token ids), "checked" (the server's tokenisation of the
        decoded probe equals the local ids) or "unchecked" (no tokenize endpoint).
      note: one public line for the user.
    """

    prompt_format: str
    tokenization: str
    note: str


def _display(url: str) -> str:
    """The URL without user info or query (never print credentials)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host  # IPv6
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


class OpenAICompletionsLM(RescoredSession):
    """An OpenAI-compatible completions endpoint behind the `NextTokenLM` protocol.

    Args:
      base_url: e.g. ``http://127.0.0.1:8000/v1``.
      model: the served model's name.
      tokenizer: an object with ``encode``, ``decode``, ``vocab_size`` and ``eos_ids``
        matching the served model (e.g. `synthgen.lm_backends.LocalTokenizer`).
      max_context: the context length (tokens) the server was started with (vLLM's
        ``--max-model-len``, llama.cpp's ``-c``, llama-cpp-python's ``--n_ctx``); required.
      top_logprobs: k, log-probs per reply (servers cap it, often at 20).
      prompt_format: "auto", "tokens" or "text" (see docs/guides/byo.md).
      concurrency: most requests in flight (and connections in the pool).
      timeout: seconds per request.
      retries: further attempts after a 429, a 503 or a connection error.
      backoff: seconds before the first retry, doubled at each further one.

    Privacy:
      The server sees every prompt, private examples included: self-host it. Each row is
      a distribution from its own prompt's reply (`to_vector`); a reply that is not one
      is refused. See the module docstring.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Any,
        *,
        max_context: int | None,
        top_logprobs: int = 20,
        prompt_format: str = "auto",
        concurrency: int = 8,
        timeout: float = 120.0,
        retries: int = 3,
        backoff: float = 0.5,
    ) -> None:
        if max_context is None or max_context < 2:
            raise ValueError(
                f"max_context (the server's context length) is required, got {max_context=}"
            )
        if top_logprobs < 1:
            raise ValueError(f"top_logprobs must be >= 1, got {top_logprobs=}")
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt_format must be one of {PROMPT_FORMATS}, {prompt_format=}")
        if concurrency < 1 or retries < 0 or timeout <= 0 or backoff < 0:
            raise ValueError(f"bad transport settings: {concurrency=} {retries=} {timeout=}")
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/completions"
        self.server = _display(self.base_url)
        self.model, self.tokenizer = model, tokenizer
        self.max_context = int(max_context)
        self.top_logprobs, self.timeout = top_logprobs, timeout
        self.prompt_format = prompt_format
        self.concurrency, self.retries, self.backoff = concurrency, retries, backoff
        self.check: ServerCheck | None = None
        self._rows: list[list[int]] = []
        self._ids: dict[str, int | None] = {}
        # Shared by forks: one pool of connections and threads per endpoint.
        self._transport: dict[str, Any] = {}
        self._lock = threading.Lock()

    # -- NextTokenLM ------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return tuple(self.tokenizer.eos_ids)

    def encode(self, text: str, *, bos: bool = False) -> list[int]:
        return self.tokenizer.encode(text, bos=bos)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def score(self, prompts: Sequence[Sequence[int]], *, length: int | None = None) -> np.ndarray:
        """Log-probs [B, V] after each prompt; the prompts go to the server concurrently
        (one request each: no shared shape to pad, `length` is unused)."""
        self.prepare()
        rows = [[int(t) for t in p] for p in prompts]
        for row in rows:
            if len(row) + 1 > self.max_context:
                # generate() refuses such runs before the charge; this guards direct use.
                raise ValueError(f"a prompt does not fit the server's context {self.max_context}")
        bodies = [self._body(row, self.prompt_format) for row in rows]
        replies = self._map(self._complete, bodies)
        return np.stack([self.to_vector(self._entries(reply)) for reply in replies])

    def fork(self) -> OpenAICompletionsLM:
        """The same endpoint (and connection pool) with its own session."""
        other = copy.copy(self)
        other._rows = []
        return other

    def close(self) -> None:
        """Closes the connection pool and the worker threads (forks share them)."""
        with self._lock:
            client, pool = self._transport.pop("client", None), self._transport.pop("pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if client is not None:
            client.close()

    # -- the public probe --------------------------------------------------------------

    def prepare(self) -> ServerCheck:
        """Probes the server once with the public `PROBE_TEXT` (idempotent).

        Resolves "auto" to "tokens" or "text", checks in text mode that the server
        tokenises the decoded probe as the local tokenizer does, and checks that the
        probe's reply holds k finite log-probs of a distribution.

        Returns:
          The `ServerCheck` (also kept as ``self.check``).

        Raises:
          LMServerError: the server is unreachable, refuses the chosen format, returns
            fewer than k log-probs or broken rows, or tokenises text differently.

        Privacy:
          Sends only `PROBE_TEXT` (public); call it before the ledger charge.
        """
        if self.check is not None:
            return self.check
        ids = self.tokenizer.encode(PROBE_TEXT, bos=True)
        fmt, refused = self.prompt_format, False
        if fmt in ("auto", "tokens"):
            try:
                reply = self._ask(self._body(ids, "tokens"))
                fmt = "tokens"
            except _Refused as exc:
                if self.prompt_format == "tokens":
                    raise LMServerError(
                        f"the LM server at {self.server} refuses token-id prompts "
                        f"(HTTP {exc.status} to the public probe): try --server-prompt text"
                    ) from None
                fmt, refused = "text", True
        if fmt == "text":
            try:
                reply = self._ask(self._body(ids, "text"))
            except _Refused as exc:
                raise LMServerError(self._status_message(exc.status, "text")) from None
        top = self._entries(reply)
        if _short(top, self.top_logprobs):
            raise LMServerError(
                f"the LM server at {self.server} returned {len(top)} log-probs for the public "
                f"probe, {self.top_logprobs} asked: try --top-logprobs {max(len(top), 1)}"
            )
        self.to_vector(top)
        if fmt == "tokens":
            check = ServerCheck("tokens", "exact", "prompts sent as token ids")
        else:
            why = "the server refuses token ids" if refused else "--server-prompt text"
            check = self._check_tokenization(ids, why)
        self.prompt_format, self.check = fmt, check
        return check

    def _check_tokenization(self, ids: list[int], why: str) -> ServerCheck:
        text = self.tokenizer.decode(ids)
        local = self._strip_bos(ids)
        server = self._server_tokens(text)
        if server is None:
            return ServerCheck(
                "text",
                "unchecked",
                f"prompts sent as text ({why}); the server has no tokenize endpoint, so its "
                "tokenisation of the decoded prompts could not be checked against the local one",
            )
        if self._strip_bos(server) != local:
            raise LMServerError(
                f"the LM server at {self.server} tokenises the decoded public probe "
                "differently from the local tokenizer: check that --model names the served "
                "model's tokenizer, or try --server-prompt tokens"
            )
        return ServerCheck(
            "text",
            "checked",
            f"prompts sent as text ({why}); the server tokenises the decoded public probe as "
            "the local tokenizer does",
        )

    def _strip_bos(self, ids: Sequence[int]) -> list[int]:
        bos = self.tokenizer.encode("", bos=True)
        ids = [int(i) for i in ids]
        return ids[len(bos) :] if bos and ids[: len(bos)] == bos else ids

    def _server_tokens(self, text: str) -> list[int] | None:
        """The server's ids of public `text` via its tokenize endpoint, or None."""
        root = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        attempts = (
            ("/extras/tokenize", {"input": text}),  # llama-cpp-python
            ("/tokenize", {"content": text}),  # llama.cpp llama-server
            ("/tokenize", {"model": self.model, "prompt": text}),  # vLLM
        )
        for path, body in attempts:
            try:
                reply = self._post(root + path, body)
            except (_Refused, LMServerError):  # no such endpoint here: try the next one
                continue
            tokens = reply.get("tokens") if isinstance(reply, dict) else None
            if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
                return tokens
        return None

    # -- requests ----------------------------------------------------------------------

    def _body(self, ids: list[int], fmt: str) -> dict:
        prompt: list[int] | str = ids if fmt == "tokens" else self.tokenizer.decode(ids)
        return {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": self.top_logprobs,
        }

    def _client(self):
        import httpx

        with self._lock:
            if "client" not in self._transport:
                limits = httpx.Limits(
                    max_connections=self.concurrency, max_keepalive_connections=self.concurrency
                )
                self._transport["client"] = httpx.Client(
                    timeout=httpx.Timeout(self.timeout), limits=limits
                )
                self._transport["pool"] = ThreadPoolExecutor(
                    self.concurrency, thread_name_prefix="lm-server"
                )
            return self._transport["client"], self._transport["pool"]

    def _map(self, fn: Callable[[dict], Any], bodies: list[dict]) -> list[Any]:
        """fn over bodies, `concurrency` at a time, results in order; first error raised."""
        if len(bodies) <= 1:
            return [fn(body) for body in bodies]
        _, pool = self._client()
        futures = [pool.submit(fn, body) for body in bodies]
        try:
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise

    def _complete(self, body: dict) -> Any:
        try:
            return self._ask(body)
        except _Refused as exc:
            raise LMServerError(self._status_message(exc.status, self.prompt_format)) from None

    def _ask(self, body: dict) -> Any:
        """One completion; asked again, special tokens barred from sampling, if it stopped.

        llama-cpp-python stops before the first token when its greedy choice is an
        end-of-generation token and then returns no log-probs. The second request biases
        the special tokens by -100 (`logit_bias`), which changes which token is sampled,
        not the log-probs it returns: those are of the raw logits (the real-server tests
        check it against the local model).
        """
        reply = self._post(self.url, body)
        if _stopped_without_logprobs(reply):
            special = getattr(self.tokenizer, "special_ids", None) or self.eos_ids
            reply = self._post(self.url, {**body, "logit_bias": {str(i): -100 for i in special}})
        return reply

    def _status_message(self, status: int, fmt: str) -> str:
        tries = ["a smaller --top-logprobs"]
        if fmt != "text":
            tries.insert(0, "--server-prompt text")
        return (
            f"the LM server at {self.server} answered HTTP {status}: see the server's log, "
            f"try {' or '.join(tries)}"
        )

    def _post(self, url: str, body: dict) -> Any:
        """POSTs JSON with retries; raises `_Refused` on a final HTTP error status.

        Connection errors and 429/503 are retried with exponential backoff (a
        ``Retry-After`` of at most 30 s is honoured); a timeout is not.
        """
        import httpx

        client, _ = self._client()
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = client.post(url, json=body)
            except httpx.TransportError as exc:  # refused, reset, closed mid-reply, timed out
                timed_out = isinstance(exc, httpx.TimeoutException)
                if not last and (not timed_out or isinstance(exc, httpx.ConnectTimeout)):
                    time.sleep(self.backoff * 2**attempt)
                    continue
                if timed_out:
                    raise LMServerError(
                        f"the LM server at {self.server} did not answer within "
                        f"{self.timeout:g} s ({type(exc).__name__}): check that it is running "
                        "and not overloaded"
                    ) from None
                raise LMServerError(
                    f"cannot reach the LM server at {self.server} ({type(exc).__name__}) "
                    f"after {self.retries + 1} attempts: check it is running and --server"
                ) from None
            if response.status_code in RETRY_STATUS and not last:
                time.sleep(_retry_after(response, self.backoff * 2**attempt))
                continue
            if response.status_code >= 400:
                # Never read the error body into a message: a server may echo the prompt.
                raise _Refused(response.status_code)
            try:
                return response.json()
            except ValueError:
                raise LMServerError(
                    f"the LM server at {self.server} answered with a body that is not JSON: "
                    "is --server the OpenAI-compatible base URL (ending in /v1)?"
                ) from None
        raise AssertionError("unreachable")

    # -- replies -----------------------------------------------------------------------

    def _entries(self, reply: Any) -> list[tuple[int | str, Any]]:
        """(id or token string, log-prob) of the first generated token's top-k.

        Reads the legacy completions form (``logprobs.top_logprobs[0]``, a dict) and the
        newer one of llama.cpp's server (``logprobs.content[0].top_logprobs``, with ids).
        """
        try:
            logprobs = reply["choices"][0]["logprobs"]
            if isinstance(logprobs, dict) and "content" in logprobs:
                return [
                    (int(e["id"]) if "id" in e else str(e["token"]), e["logprob"])
                    for e in logprobs["content"][0]["top_logprobs"]
                ]
            top = logprobs["top_logprobs"][0]
            return [(str(token), value) for token, value in top.items()]
        except (KeyError, IndexError, TypeError, AttributeError, ValueError):
            raise LMServerError(
                f"the LM server at {self.server} sent a reply without top log-probs "
                "(choices[0].logprobs): does it support `logprobs` on /completions?"
            ) from None

    def _token_id(self, token: int | str) -> int | None:
        if isinstance(token, int):
            return token
        if token not in self._ids:
            if token.startswith("token_id:"):
                self._ids[token] = int(token.split(":", 1)[1])
            else:
                ids = self.tokenizer.encode(token) if token else []
                self._ids[token] = ids[0] if len(ids) == 1 else None
        return self._ids[token]

    def to_vector(self, top: dict[str, float] | Sequence[tuple[int | str, Any]]) -> np.ndarray:
        """Full-vocabulary log-probs [V] of a distribution from a top-k reply.

        The top-k probabilities are kept and the residual 1 - sum(top-k) is spread
        uniformly over the other tokens (entries that map to no local id count in the
        residual). Only float rounding (`TOLERANCE`) is repaired.

        Fewer entries than `top_logprobs` are accepted here (tokens with the same name
        collapse into one entry in llama-cpp-python); a server that caps k is refused by
        the public probe (`prepare`), before the charge.

        Raises:
          LMServerError: no entry, a non-finite value, a positive log-probability or a
            top-k mass above 1: the row would not be a distribution.
        """
        entries = list(top.items()) if isinstance(top, dict) else list(top)
        if not entries:
            self._refuse("no log-probs")
        v = self.vocab_size
        known: dict[int, float] = {}
        mass = 0.0
        for token, value in entries:
            logprob = _finite(value)
            if logprob is None:
                self._refuse("a log-prob that is not a finite number")
            if logprob > TOLERANCE:
                self._refuse("a positive log-prob")
            mass += math.exp(min(logprob, 0.0))
            token_id = self._token_id(token)
            if token_id is not None and 0 <= token_id < v:
                known[token_id] = max(known.get(token_id, -math.inf), min(logprob, 0.0))
        if mass > 1.0 + TOLERANCE:
            self._refuse("top-k probabilities that sum to more than 1")
        probs = np.zeros(v, np.float64)
        for token_id, logprob in known.items():
            probs[token_id] = math.exp(logprob)
        rest = v - len(known)
        if rest:
            residual = max(0.0, 1.0 - float(probs.sum())) / rest
            mask = np.ones(v, bool)
            mask[list(known)] = False
            probs[mask] = residual
        probs /= probs.sum()
        with np.errstate(divide="ignore"):
            return np.log(probs).astype(np.float32)

    def _refuse(self, what: str) -> None:
        raise LMServerError(
            f"the LM server at {self.server} sent {what}; refused (each row must be a "
            "probability distribution)"
        )


class _Refused(Exception):
    """An HTTP error status (internal: turned into an `LMServerError` by the caller)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _stopped_without_logprobs(reply: Any) -> bool:
    try:
        choice = reply["choices"][0]
        logprobs = choice["logprobs"]
        top = logprobs["content"] if "content" in logprobs else logprobs["top_logprobs"]
        return choice.get("finish_reason") == "stop" and len(top) == 0
    except (KeyError, IndexError, TypeError, AttributeError):
        return False


def _short(entries: Sequence[tuple[int | str, Any]], k: int) -> bool:
    """Fewer than k entries for the public probe, not explained by an empty-string entry."""
    return len(entries) < k and not any(token == EMPTY_TOKEN for token, _ in entries)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _retry_after(response: Any, default: float) -> float:
    try:
        return min(max(float(response.headers.get("Retry-After", default)), 0.0), 30.0)
    except ValueError:
        return default
