"""The OpenAI-compatible backend against a real server: llama-cpp-python on the SmolLM2 GGUF.

The server (`tests/llama_server.py`, the `server-test` extra) runs on a loopback port
chosen at run time, with one thread, and is stopped afterwards; without llama-cpp-python
the tests skip with the reason. Few tokens and few prompts keep the file short on 2 cores.
"""

import json
import subprocess
import sys
import time

import cli_process
import numpy as np
import pytest
from llama_server import LlamaServer, find_llama_server, missing_reason

from synthgen import assets
from synthgen.lm_backends import LocalTokenizer
from synthgen.openai_backend import LMServerError, OpenAICompletionsLM

pytestmark = pytest.mark.slow
needs_llama_cpp_python = pytest.mark.skipif(
    missing_reason() is not None, reason=str(missing_reason())
)

MODEL = "smollm2-135m-instruct"
CONTEXT = 2048
# Public prompts for the agreement with the local Flax Llama (fixed, no private text).
PUBLIC_PROMPTS = (
    "The capital of France is",
    "Here are paragraphs from encyclopedia articles about rivers.\n\nParagraph: The Nile",
    "def fibonacci(n):\n    ",
    "Here are example paragraphs.\n\nParagraph: Mount Everest is",
)
# Its greedy next token is a special one (end of text): llama-cpp-python then stops before
# the first token and returns no log-probs unless asked again (`OpenAICompletionsLM._ask`).
STOPPING_PROMPT = "Question: What is two plus two?\nAnswer:"
SECRET = "Zorblax Quentavian"  # stands for private text: never in an error line


def _gguf() -> str:
    return str(assets.resolve(MODEL))


@pytest.fixture(scope="module")
def llama_server():
    if missing_reason() is not None:
        pytest.skip(str(missing_reason()))
    with LlamaServer(_gguf(), n_ctx=CONTEXT, n_threads=1) as server:
        yield server


@pytest.fixture(scope="module")
def tokenizer():
    return LocalTokenizer(MODEL)


def _remote(server, tokenizer, **kwargs):
    return OpenAICompletionsLM(server.url, "x", tokenizer, max_context=CONTEXT, **kwargs)


def test_auto_probe_picks_text_and_checks_the_tokenization(llama_server, tokenizer):
    remote = _remote(llama_server, tokenizer)
    check = remote.prepare()
    assert (check.prompt_format, check.tokenization) == ("text", "checked")
    assert remote.prompt_format == "text"
    # Forced token ids: refused by the public probe, before any other prompt is sent.
    forced = _remote(llama_server, tokenizer, prompt_format="tokens")
    with pytest.raises(LMServerError, match="refuses token-id prompts.*--server-prompt text"):
        forced.prepare()


def _kl_top_k(server_row: np.ndarray, local_row: np.ndarray) -> float:
    """KL(server ‖ local) over the server's returned tokens and one bucket for the rest.

    The server returns only its top-k, so this is the KL of both distributions coarsened
    to {each returned token, everything else} (a lower bound of the full KL).
    """
    top = np.flatnonzero(server_row > server_row.min())  # the rest holds the uniform residual
    p = np.exp(server_row[top].astype(np.float64))
    q = np.exp(local_row[top].astype(np.float64))
    p, q = np.append(p, max(1 - p.sum(), 1e-12)), np.append(q, max(1 - q.sum(), 1e-12))
    return float(np.sum(p * np.log(p / q)))


@pytest.fixture(scope="module")
def local_lm():
    from synthgen.lm_backends import FlaxLM

    return FlaxLM.load(MODEL)


# Local top-1 margins below this (nats) are near ties: "def fibonacci(n):\n    " gives
# " def" -1.656 against " fib" -1.694 locally and the reverse order on a llama.cpp build.
NEAR_TIE = 0.2


def _agreement(remote, local_lm, tokenizer, texts) -> list[float]:
    """Same top-1 as the local model on every prompt; the KL of each (asserted < 0.02)."""
    prompts = [tokenizer.encode(text, bos=True) for text in texts]
    served = remote.score(prompts)  # concurrently, back in prompt order
    kls = []
    for prompt, row in zip(prompts, served):
        want = local_lm.score([prompt])[0]
        runner_up, best = np.sort(want)[-2:]
        if best - runner_up > NEAR_TIE:
            assert int(np.argmax(row)) == int(np.argmax(want))
        else:  # a near tie: the server's quantized kernels may order the two either way
            assert int(np.argmax(row)) in np.argsort(want)[-2:]
        assert np.exp(row.astype(np.float64)).sum() == pytest.approx(1.0, abs=1e-5)
        kls.append(_kl_top_k(row, want))
    print(f"KL(server || local) over the top-20 + rest: {[round(x, 4) for x in kls]}")
    assert max(kls) < 0.02
    return kls


def test_log_probs_agree_with_the_local_flax_llama(llama_server, tokenizer, local_lm):
    _agreement(_remote(llama_server, tokenizer), local_lm, tokenizer, PUBLIC_PROMPTS)


def test_a_greedy_special_token_still_gets_raw_log_probs(llama_server, tokenizer, local_lm):
    remote = _remote(llama_server, tokenizer)
    prompt = tokenizer.encode(STOPPING_PROMPT, bos=True)
    row = remote.score([prompt])[0]
    want = local_lm.score([prompt])[0]
    assert int(np.argmax(want)) in tokenizer.special_ids  # the local model would stop
    # llama-cpp-python names special tokens "": their mass joins the uniform residual.
    assert row[int(np.argmax(want))] == row.min()
    # The ordinary tokens keep their raw log-probs (the -100 bias only changed the sample).
    kl = _kl_top_k(row, want)
    print(f"KL(llama.cpp || local) after a greedy special token: {kl:.4f}")
    assert kl < 0.02


def _private_file(tmp_path):
    private = tmp_path / "private.jsonl"
    topics = ("rivers", "mountains")
    text = f"{SECRET} wrote that the river runs north past the old mill."
    private.write_text(
        "".join(json.dumps({"body": text, "topic": topics[i % 2]}) + "\n" for i in range(40))
    )
    return private


def _generate_docs_args(server, tmp_path, *extra):
    return [
        sys.executable, "-m", "dpsynth.cli.synthgen", "generate-docs",
        "--private", str(_private_file(tmp_path)), "--text-field", "body",
        "--label-field", "topic", "--labels", "rivers,mountains",
        "--public-pool-size", "20", "--num-examples", "1", "--epsilon", "8",
        "--subsets", "3", "--shots", "1", "--shot-tokens", "24",
        "--model", MODEL, "--server", server.url, "--server-model", "x",
        "--server-context", str(CONTEXT),
        "--out", str(tmp_path / "out"), "--ledger", str(tmp_path / "ledger.sqlite"), *extra,
    ]  # fmt: skip


def test_generate_docs_end_to_end_through_the_server(llama_server, tmp_path):
    result = cli_process.run(
        _generate_docs_args(llama_server, tmp_path, "--max-new-tokens", "3"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "server: prompts sent as text (the server refuses token ids)" in result.stderr
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["model"]["backend"].startswith(llama_server.url)
    rows = [json.loads(line) for line in (tmp_path / "out" / "synthetic.jsonl").open()]
    assert len(rows) == 1 and rows[0]["label"] == "mountains"  # the first sorted label
    assert json.loads(result.stdout.strip().splitlines()[-1])["tokens_released"] >= 1


@needs_llama_cpp_python
def test_a_server_killed_mid_run_is_one_clear_line_no_output_and_the_charge_stands(tmp_path):
    from synthgen.privacy.ledger import PrivacyLedger

    ledger_path = tmp_path / "ledger.sqlite"
    with LlamaServer(_gguf(), n_ctx=CONTEXT, n_threads=1) as server:
        # Far more tokens than can be released before the kill below.
        proc = subprocess.Popen(
            _generate_docs_args(server, tmp_path, "--max-new-tokens", "256"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 240
            while not (ledger_path.exists() and PrivacyLedger(ledger_path).charges(
                "default", "private"
            )):  # fmt: skip
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "the run was never charged"
                time.sleep(0.1)
            server.kill()  # after the charge, before the run can finish
            stdout, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 1, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "LM server at " + server.url in last, stderr
    assert "Traceback" not in stderr and SECRET not in stderr and SECRET not in stdout
    assert not (tmp_path / "out").exists()
    assert len(PrivacyLedger(ledger_path).charges("default", "private")) == 1


@pytest.mark.skipif(
    find_llama_server() is None,
    reason="llama.cpp's llama-server is not on PATH nor in $LLAMA_SERVER (not on PyPI: "
    "build it from llama.cpp's source, `cmake --build build --target llama-server`)",
)
def test_llama_cpp_llama_server_takes_token_ids_and_agrees(tokenizer, local_lm):
    # llama.cpp's own server: token-id prompts, ids in its replies (EOS included), slots.
    binary = find_llama_server()
    with LlamaServer(_gguf(), n_ctx=CONTEXT, n_threads=1, binary=binary, parallel=2) as server:
        remote = _remote(server, tokenizer)
        check = remote.prepare()
        assert (check.prompt_format, check.tokenization) == ("tokens", "exact")
        # The fibonacci prompt is a near tie locally (0.04 nats): left out of the top-1 check.
        texts = [t for t in PUBLIC_PROMPTS if not t.startswith("def")] + [STOPPING_PROMPT]
        _agreement(remote, local_lm, tokenizer, texts)


@needs_llama_cpp_python
def test_private_evolution_runs_through_the_server_with_public_prompts_only(
    llama_server, tokenizer
):
    # PE's LM calls go through any NextTokenLM: here one `score` request per row and token.
    from synthgen import evolution

    remote = _remote(llama_server, tokenizer)
    remote.prepare()
    sampler = evolution.make_sampler(remote, max_new_tokens=3, batch_size=2)
    assert isinstance(sampler, evolution.NextTokenSampler)
    sent = []
    score = remote.score

    def spy(prompts):
        sent.extend(remote.decode(p) for p in prompts)
        return score(prompts)

    remote.score = spy
    config = evolution.EvolutionConfig(
        num_samples=2, iterations=2, noise_multiplier=2.0, public_size=100,
        labels=("rivers", "music"), max_new_tokens=3, batch_size=2,
    )  # fmt: skip
    private = [f"{SECRET} sailed down the river {i}" for i in range(5)] + ["a song"] * 5
    labels = ["rivers"] * 5 + ["music"] * 5

    def embed(texts):
        rng = np.random.default_rng(abs(hash(tuple(texts))) % 2**32)
        return rng.normal(size=(len(texts), 8)).astype(np.float32)

    result = evolution.evolve(sampler, embed, private, config, rng=np.random.default_rng(0),
                              private_labels=labels)  # fmt: skip
    remote.close()
    assert result.labels == ["rivers", "music"] and result.samples_generated == 4
    assert sent and not any(SECRET in prompt for prompt in sent)
