"""The OpenAI-compatible backend against a local completions server serving the tiny LM."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from synthgen import fewshot
from synthgen.lm_backends import TinyLM
from synthgen.openai_backend import OpenAICompletionsLM


class _Handler(BaseHTTPRequestHandler):
    lm = TinyLM()
    requests = 0
    inflate = 0.0  # > 0: a broken server whose top-k log-probs are shifted up by this

    def do_POST(self):  # noqa: N802 - http.server's name
        type(self).requests += 1
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/v1/completions" and body["max_tokens"] == 1
        logprobs = self.lm.score([body["prompt"]])[0]
        top = np.argsort(-logprobs)[: body["logprobs"]]
        # ASCII tokens as text (llama.cpp, OpenAI), the rest in vLLM's "token_id:<n>" form.
        tokens = {self.lm.decode([int(i)]) if i < 128 else f"token_id:{int(i)}":
                  float(logprobs[i]) + self.inflate for i in top}  # fmt: skip
        reply = {"choices": [{"text": "", "logprobs": {"top_logprobs": [tokens]}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class _InflatingHandler(_Handler):
    inflate = float(np.log(1.8))  # every top-k probability x 1.8


def _serve(handler):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/v1"


@pytest.fixture(scope="module")
def server():
    httpd, url = _serve(_Handler)
    yield url
    httpd.shutdown()


@pytest.fixture(scope="module")
def broken_server():
    httpd, url = _serve(_InflatingHandler)
    yield url
    httpd.shutdown()


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


def test_rows_of_a_broken_server_are_normalised_to_distributions(broken_server):
    # A server whose top-k mass is 1.8 would break the sqrt(2)/M sensitivity: the row that
    # reaches the mechanism sums to 1, with the top-k in their returned proportions.
    tiny = TinyLM()
    remote = OpenAICompletionsLM(broken_server, "tiny", tiny, max_context=512, top_logprobs=200)
    prompt = tiny.encode("abab abab ab")
    got = np.exp(remote.score([prompt])[0].astype(np.float64))
    assert got.sum() == pytest.approx(1.0, abs=1e-5)
    want = np.exp(tiny.score([prompt])[0].astype(np.float64))
    top = np.argsort(-want)[:200]
    np.testing.assert_allclose(got[top] / got[top].sum(), want[top] / want[top].sum(), rtol=1e-5)
    # NaN and positive log-probs are not trusted either.
    vector = np.exp(remote.to_vector({"a": float("nan"), "b": 3.0, "c": -1.0}).astype(np.float64))
    assert vector.sum() == pytest.approx(1.0, abs=1e-5) and vector[ord("a")] == 0


def test_the_server_context_is_required_and_checked_before_the_charge(server, tmp_path):
    from synthgen.privacy.ledger import PrivacyLedger, Scope

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
                         rng=np.random.default_rng(0), ledger=ledger,
                         ledger_scope=("t", "d"))  # fmt: skip
    assert ledger.charges("t", "d") == [] and _Handler.requests == before


def _generate_docs(server, tmp_path, *extra):
    import subprocess
    import sys

    private = tmp_path / "private.jsonl"
    private.write_text("".join(json.dumps({"body": "abab abab", "topic": "x"}) + "\n"
                               for _ in range(40)))  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "synthgen.cli", "generate-docs", "--private", str(private),
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
    result = _generate_docs(server, tmp_path, "--server-context", "512")
    assert result.returncode == 0, result.stderr
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["model"]["backend"].startswith(server)
