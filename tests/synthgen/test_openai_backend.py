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

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/v1/completions" and body["max_tokens"] == 1
        logprobs = self.lm.score([body["prompt"]])[0]
        top = np.argsort(-logprobs)[: body["logprobs"]]
        # ASCII tokens as text (llama.cpp, OpenAI), the rest in vLLM's "token_id:<n>" form.
        tokens = {self.lm.decode([int(i)]) if i < 128 else f"token_id:{int(i)}": float(logprobs[i])
                  for i in top}  # fmt: skip
        reply = {"choices": [{"text": "", "logprobs": {"top_logprobs": [tokens]}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def test_top_k_logprobs_are_exact_and_the_rest_gets_the_residual(server):
    tiny = TinyLM()
    remote = OpenAICompletionsLM(server, "tiny", tiny, top_logprobs=5)
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
    remote = OpenAICompletionsLM(server, "tiny", tiny, top_logprobs=8)
    rows = [{"text": "abcdefg", "label": "x"}] * 40  # one continuation per bigram
    template = fewshot.PromptTemplate(header="{label}\n", shot="{text}\n", stem="")
    config = fewshot.FewShotConfig(subsets=20, shots=1, max_new_tokens=8, noise_multiplier=1.0,
                                   resample="example")  # fmt: skip
    result = fewshot.generate(remote, rows, [{"label": "x"}], template, config,
                              pool_field="label", rng=np.random.default_rng(0))  # fmt: skip
    assert result.texts == ["abcdefg"]


def test_generate_docs_cli_with_a_server(server, tmp_path):
    import subprocess
    import sys

    private = tmp_path / "private.jsonl"
    private.write_text("".join(json.dumps({"body": "abab abab", "topic": "x"}) + "\n"
                               for _ in range(40)))  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "synthgen.cli", "generate-docs", "--private", str(private),
         "--text-field", "body", "--label-field", "topic", "--num-examples", "1",
         "--epsilon", "8", "--subsets", "4", "--shots", "2", "--max-new-tokens", "4",
         "--model", "tiny", "--server", server, "--server-model", "tiny",
         "--out", str(tmp_path / "out"), "--ledger", str(tmp_path / "l.sqlite")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["model"]["backend"].startswith(server)
