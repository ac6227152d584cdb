"""The OpenAI-compatible backend against small hand-written servers serving the tiny LM.

Fast unit tests of the mapping, the probe, the validation and the transport; the tests
against a real server (llama-cpp-python) are in test_lm_server.py.
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from synthgen import fewshot
from synthgen.lm_backends import TinyLM
from synthgen.openai_backend import PROBE_TEXT, LMServerError, OpenAICompletionsLM
from synthgen.privacy.receipts import ledger_payer


def _pay(ledger):
    """The payer of scope (t, d), as the commands build it."""
    return ledger_payer(ledger, ("t", "d"), stage="fewshot-generate")


SECRET = "zq-secret-zq"  # stands for private text: must never reach an error message


class _Handler(BaseHTTPRequestHandler):
    lm = TinyLM()
    requests = 0
    inflate = 0.0  # > 0: a broken server whose top-k log-probs are shifted up by this
    accept_tokens = True  # False: token-id prompts get HTTP 500 (as llama-cpp-python)
    tokenize = False  # True: serves llama-cpp-python's /extras/tokenize
    busy = 0  # answer 503 to this many requests first
    cap = None  # a server that returns at most this many log-probs
    poison = None  # a value put in place of the top log-prob (NaN, "x", ...)
    delay = 0.0  # seconds per request, or a function of the prompt's ids (concurrency tests)
    stops = None  # "unbiased": stop before the first token unless logit_bias (llama-cpp-python)
    biases: list = []  # the logit_bias of every completion request
    log: list = []  # every prompt received, in arrival order

    def do_POST(self):  # noqa: N802 - http.server's name
        cls = type(self)
        cls.requests += 1
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/extras/tokenize" and cls.tokenize:
            return self._send(200, {"tokens": self.lm.encode(body["input"])})
        if self.path != "/v1/completions":
            return self._send(404, {"detail": "Not Found"})
        assert body["max_tokens"] == 1
        cls.log.append(body["prompt"])
        if cls.busy > 0:
            cls.busy -= 1
            return self._send(503, {"error": "busy"})
        prompt = body["prompt"]
        if isinstance(prompt, list) and not cls.accept_tokens:
            # As llama-cpp-python: a 500 whose body echoes the rejected prompt.
            return self._send(500, {"error": f"prompt must be a string, got {prompt}"})
        if isinstance(prompt, str):
            prompt = self.lm.encode(prompt)
        cls.biases.append(body.get("logit_bias"))
        if cls.stops == "always" or (cls.stops == "unbiased" and "logit_bias" not in body):
            reply = {"text": "", "finish_reason": "stop", "logprobs": {"top_logprobs": []}}
            return self._send(200, {"choices": [reply]})
        time.sleep(cls.delay(prompt) if callable(cls.delay) else cls.delay)
        logprobs = self.lm.score([prompt])[0]
        top = np.argsort(-logprobs)[: min(body["logprobs"], cls.cap or 10**9)]
        # ASCII tokens as text (llama.cpp, OpenAI), the rest in vLLM's "token_id:<n>" form.
        tokens = {self.lm.decode([int(i)]) if i < 128 else f"token_id:{int(i)}":
                  float(logprobs[i]) + cls.inflate for i in top}  # fmt: skip
        if cls.poison is not None:
            tokens[next(iter(tokens))] = cls.poison
        self._send(200, {"choices": [{"text": "", "logprobs": {"top_logprobs": [tokens]}}]})

    def _send(self, status, reply):
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def _handler(**attributes):
    return type("Handler", (_Handler,), {"log": [], "biases": [], **attributes})


def _serve(handler):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/v1"


@pytest.fixture
def serve():
    servers = []

    def start(**attributes):
        handler = _handler(**attributes)
        httpd, url = _serve(handler)
        servers.append(httpd)
        return url, handler

    yield start
    for httpd in servers:
        httpd.shutdown()


@pytest.fixture(scope="module")
def server():
    httpd, url = _serve(_Handler)
    yield url
    httpd.shutdown()


def _remote(url, k=5, **kwargs):
    return OpenAICompletionsLM(
        url, "tiny", TinyLM(), max_context=512, top_logprobs=k, backoff=0.01, **kwargs
    )


def test_top_k_logprobs_are_exact_and_the_rest_gets_the_residual(server):
    tiny = TinyLM()
    remote = OpenAICompletionsLM(server, "tiny", tiny, max_context=512, top_logprobs=5)
    prompt = tiny.encode("abab abab ab")
    got = remote.score([prompt])[0]
    want = tiny.score([prompt])[0]
    top = np.argsort(-want)[:5]
    np.testing.assert_allclose(got[top], want[top], rtol=1e-6)
    assert np.exp(got.astype(np.float64)).sum() == pytest.approx(1.0, abs=1e-6)
    rest = np.setdiff1d(np.arange(tiny.vocab_size), top)
    assert np.ptp(got[rest]) == 0  # uniform residual
    assert remote.check.prompt_format == "tokens" and remote.check.tokenization == "exact"


def test_fewshot_generation_through_the_server(server):
    tiny = TinyLM()
    remote = OpenAICompletionsLM(server, "tiny", tiny, max_context=512, top_logprobs=8)
    rows = [{"text": "abcdefg", "label": "x"}] * 40  # one continuation per bigram
    template = fewshot.PromptTemplate(header="{label}\n", shot="{text}\n", stem="")
    config = fewshot.FewShotConfig(public_pool_size=40, subsets=20, shots=1, max_new_tokens=8,
                                   noise_multiplier=1.0, resample="example")  # fmt: skip
    result = fewshot.generate(remote, rows, [{"label": "x"}], template, config,
                              pool_field="label", rng=np.random.default_rng(0))  # fmt: skip
    assert result.texts == ["abcdefg"]


def test_concurrent_prompts_come_back_in_prompt_order(serve):
    # The earlier a prompt, the slower its answer: replies complete in reverse order.
    slow = {ord("b"): 0.3, ord("y"): 0.2, ord("n"): 0.1}
    url, _ = serve(delay=lambda ids: slow.get(ids[-1], 0.0))
    tiny = TinyLM()
    prompts = [tiny.encode(text) for text in ("abab ab", "xyxy xy", "mnmn mn", "pqpq pq") * 2]
    remote = _remote(url, k=5, concurrency=4)
    got = remote.score(prompts)
    sequential = _remote(url, k=5, concurrency=1).score(prompts)
    np.testing.assert_array_equal(got, sequential)
    np.testing.assert_array_equal(got.argmax(-1), tiny.score(prompts).argmax(-1))


def test_auto_sends_text_to_a_server_that_refuses_token_ids(serve):
    url, handler = serve(accept_tokens=False, tokenize=True)
    remote = _remote(url)
    private = remote.encode(f"{SECRET} abab ab")
    got = remote.score([private])[0]
    np.testing.assert_array_equal(got.argmax(), TinyLM().score([private])[0].argmax())
    assert remote.check.prompt_format == "text" and remote.check.tokenization == "checked"
    # Only the public probe was ever sent as token ids.
    sent_as_ids = [p for p in handler.log if isinstance(p, list)]
    assert sent_as_ids == [TinyLM().encode(PROBE_TEXT, bos=True)]
    assert handler.log[-1] == f"{SECRET} abab ab"


def test_text_without_a_tokenize_endpoint_is_unchecked(serve):
    url, _ = serve(accept_tokens=False)
    check = _remote(url).prepare()
    assert check.prompt_format == "text" and check.tokenization == "unchecked"
    assert "could not be checked" in check.note


def test_tokens_forced_on_a_text_only_server_is_refused_by_the_probe(serve):
    url, handler = serve(accept_tokens=False)
    remote = _remote(url, prompt_format="tokens")
    with pytest.raises(LMServerError, match="refuses token-id prompts.*--server-prompt text"):
        remote.score([remote.encode(SECRET)])
    assert SECRET not in json.dumps(handler.log)


def test_an_http_error_is_one_line_without_the_prompt_or_the_reply(serve):
    url, _ = serve(accept_tokens=False)
    remote = _remote(url, prompt_format="tokens")
    remote.check = object()  # skip the probe: a private prompt reaches the failing server
    with pytest.raises(LMServerError) as info:
        remote.score([remote.encode(SECRET)])
    message = str(info.value)
    assert "HTTP 500" in message and url in message and "--server-prompt text" in message
    assert "--top-logprobs" in message and "\n" not in message
    assert SECRET not in message and "must be a string" not in message


def test_a_reply_that_stopped_before_the_first_token_is_asked_again(serve):
    url, handler = serve(stops="unbiased")
    remote = _remote(url)
    prompt = remote.encode("abab ab")
    np.testing.assert_allclose(remote.score([prompt])[0].max(), TinyLM().score([prompt])[0].max())
    bias = {str(TinyLM.EOS): -100}  # special tokens barred from the sample, not the log-probs
    assert handler.biases == [None, bias, None, bias]  # the probe, then the prompt
    with pytest.raises(LMServerError, match="without top log-probs"):
        _remote(serve(stops="always")[0]).prepare()


def test_busy_server_is_retried(serve):
    url, handler = serve(busy=2)
    remote = _remote(url)
    assert remote.score([remote.encode("abab")]).shape == (1, 259)
    assert handler.busy == 0


def test_unreachable_server_is_a_clear_error():
    import socket

    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    remote = _remote(url, retries=1)
    with pytest.raises(LMServerError, match=r"cannot reach the LM server at .* 2 attempts"):
        remote.score([remote.encode(SECRET)])


def test_a_server_that_caps_k_is_refused_by_the_probe(serve):
    url, _ = serve(cap=3)
    with pytest.raises(LMServerError, match="returned 3 log-probs.*try --top-logprobs 3"):
        _remote(url, k=8).prepare()


@pytest.mark.parametrize(
    "poison, inflate, match",
    [
        (float("nan"), 0.0, "not a finite number"),
        ("x", 0.0, "not a finite number"),
        (0.5, 0.0, "positive log-prob"),
        (None, float(np.log(1.05)), "sum to more than 1"),
    ],
)
def test_rows_that_are_not_distributions_are_refused(serve, poison, inflate, match):
    # A server whose top-k mass is 1.05 (or that sends NaN) would break the sqrt(2)/M
    # sensitivity: the row is refused, never repaired into a distribution.
    url, _ = serve(poison=poison, inflate=inflate)
    with pytest.raises(LMServerError, match=match):
        _remote(url, k=200).prepare()


def test_to_vector_keeps_collapsed_replies_and_refuses_broken_ones(server):
    remote = _remote(server, k=3)
    # llama-cpp-python names special and partial-UTF-8 tokens "" (or a shared prefix):
    # several tokens collapse into one entry; the reply stays a distribution.
    row = np.exp(remote.to_vector({"a": -1.0, "": -3.0}).astype(np.float64))
    assert row.sum() == pytest.approx(1.0, abs=1e-6) and row[ord("a")] == pytest.approx(np.e**-1)
    with pytest.raises(LMServerError, match="no log-probs"):
        remote.to_vector({})
    with pytest.raises(LMServerError, match="finite"):
        remote.to_vector({"a": float("-inf"), "b": -1.0, "c": -2.0})
    # Float rounding is not a broken row.
    row = np.exp(remote.to_vector({"a": 1e-6, "b": -20.0, "c": -21.0}).astype(np.float64))
    assert row.sum() == pytest.approx(1.0, abs=1e-6)


def test_the_server_context_is_required_and_checked_before_the_charge(server, tmp_path):
    from synthgen.privacy.ledger import PrivacyLedger
    from synthgen.privacy.ledger_types import Scope

    tiny = TinyLM()
    with pytest.raises(ValueError, match="max_context"):
        OpenAICompletionsLM(server, "tiny", tiny, max_context=None)
    remote = OpenAICompletionsLM(server, "tiny", tiny, max_context=24)
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite")
    ledger.open_scope(Scope("t", "d", 100.0, 1 / 400))
    config = fewshot.FewShotConfig(public_pool_size=40, subsets=5, shots=2, max_new_tokens=8,
                                   noise_multiplier=1.0)  # fmt: skip
    before = _Handler.requests
    with pytest.raises(ValueError, match="context"):
        fewshot.generate(remote, [{"text": "abcdefg", "label": "x"}] * 40, [{"label": "x"}],
                         fewshot.DOCUMENT_TEMPLATE, config, pool_field="label",
                         rng=np.random.default_rng(0), pay=_pay(ledger))  # fmt: skip
    assert ledger.charges("t", "d") == [] and _Handler.requests == before


def _generate_docs(server, tmp_path, *extra):
    import sys

    import cli_process

    private = tmp_path / "private.jsonl"
    private.write_text("".join(json.dumps({"body": "abab abab", "topic": "x"}) + "\n"
                               for _ in range(40)))  # fmt: skip
    return cli_process.run(
        [sys.executable, "-m", "dpsynth.cli.synthgen", "generate-docs", "--private", str(private),
         "--text-field", "body", "--label-field", "topic", "--labels", "x",
         "--public-pool-size", "40", "--num-examples", "1",
         "--epsilon", "8", "--subsets", "4", "--shots", "2", "--max-new-tokens", "4",
         "--model", "tiny", "--server", server, "--server-model", "tiny",
         "--out", str(tmp_path / "out"), "--ledger", str(tmp_path / "l.sqlite"), *extra],
        capture_output=True, text=True,
    )  # fmt: skip


def test_generate_docs_cli_with_a_server(server, tmp_path):
    missing = _generate_docs(server, tmp_path)
    assert missing.returncode != 0 and "--server-context" in missing.stderr
    assert not (tmp_path / "out").exists()
    result = _generate_docs(server, tmp_path, "--server-context", "512", "--top-logprobs", "5")
    assert result.returncode == 0, result.stderr
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["model"]["backend"].startswith(server)
