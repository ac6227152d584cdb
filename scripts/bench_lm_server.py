"""Tokens/s of the OpenAI-compatible backend: the M prompts of a token concurrently vs in turn.

M n-shot prompts built from wiki-summaries-en lead paragraphs (public; each shot cut to
--shot-tokens) go through `OpenAICompletionsLM` as a few-shot session does: `start` scores
the M prompts, then `append` feeds one token (the first row's argmax) to every row and
scores them again, --tokens times in all. The same session runs with one request in flight
(sequential) and with --concurrency requests in flight (a bounded httpx pool, results in
prompt order). A warm-up session of each runs first (the server's prompt cache is then
equally warm for both), then --repeats interleaved sessions of each; the fastest counts.

Without --server it starts a local llama-cpp-python server (`tests/llama_server.py`, the
`server-test` extra) on the --model GGUF. That server runs one request at a time (its
requests share one model behind a lock; it has no parallel slots), so concurrency can
only overlap HTTP and JSON work with compute there. A server with parallel slots (vLLM,
llama.cpp's ``llama-server --parallel N``) is measured with --server URL --server-context N.

    python scripts/bench_lm_server.py                       # local llama-cpp-python server
    python scripts/bench_lm_server.py --server http://127.0.0.1:8080/v1 --server-context 4096

Last line: ``concurrent_vs_sequential=<ratio> tokens_per_s=<concurrent tokens/s>``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import numpy as np

from synthgen import assets, corpora, fewshot
from synthgen.fewshot.prompts import _Prompts
from synthgen.lm_backends import LocalTokenizer
from synthgen.openai_backend import OpenAICompletionsLM


def _session(lm: OpenAICompletionsLM, prompts: list[list[int]], tokens: int) -> float:
    """Seconds of one session: `start` then `tokens - 1` appends (`tokens` scored steps)."""
    begin = time.perf_counter()
    logprobs = lm.start(prompts, tokens)
    for _ in range(tokens - 1):
        logprobs = lm.append(int(np.argmax(logprobs[0])))
    return time.perf_counter() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", help="base URL of a running server (default: start one)")
    parser.add_argument("--server-model", default="smollm2")
    parser.add_argument("--server-context", type=int, default=2048)
    parser.add_argument("--server-prompt", default="auto", help="auto | tokens | text")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="tokenizer / GGUF")
    parser.add_argument("--subsets", type=int, default=8, help="M prompts per token")
    parser.add_argument("--shots", type=int, default=2)
    parser.add_argument("--shot-tokens", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=4, help="scored steps per session")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--n-threads", type=int, default=2, help="threads of a started server")
    parser.add_argument("--repeats", type=int, default=2, help="sessions of each (best kept)")
    args = parser.parse_args()

    tokenizer = LocalTokenizer(args.model)
    docs = corpora.load_wiki_summaries("wiki-summaries-en")
    rows = [{"text": d, "label": t} for d, t in zip(docs["document"], docs["topic"], strict=True)]
    with contextlib.ExitStack() as stack:
        url = args.server
        if url is None:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
            from llama_server import LlamaServer

            server = LlamaServer(
                assets.resolve(args.model), n_ctx=args.server_context, n_threads=args.n_threads
            )
            url = stack.enter_context(server).url
            print(f"started llama-cpp-python server at {url} (one request at a time)", flush=True)

        def backend(concurrency: int) -> OpenAICompletionsLM:
            lm = OpenAICompletionsLM(
                url,
                args.server_model,
                tokenizer,
                max_context=args.server_context,
                prompt_format=args.server_prompt,
                concurrency=concurrency,
            )
            stack.callback(lm.close)
            return lm

        sequential, concurrent = backend(1), backend(args.concurrency)
        check = concurrent.prepare()
        print(f"server: {check.note}", flush=True)
        sequential.prepare()
        prompts = _Prompts(concurrent, fewshot.DOCUMENT_TEMPLATE, rows, args.shot_tokens)
        frame = prompts.frame({"label": "History"})
        shots = np.arange(args.subsets * args.shots).reshape(args.subsets, args.shots)
        batch = [prompts.prompt(frame, s.tolist()) for s in shots]
        print(
            f"M={len(batch)} prompt tokens: mean={np.mean([len(p) for p in batch]):.0f} "
            f"steps={args.tokens} concurrency={args.concurrency}",
            flush=True,
        )
        _session(sequential, batch, args.tokens)  # warm-up
        _session(concurrent, batch, args.tokens)
        seconds_seq, seconds_con = np.inf, np.inf
        for _ in range(args.repeats):  # interleaved: a load change on the host hits both
            seconds_seq = min(seconds_seq, _session(sequential, batch, args.tokens))
            seconds_con = min(seconds_con, _session(concurrent, batch, args.tokens))
    print(
        f"sequential: {seconds_seq:.2f} s ({args.tokens / seconds_seq:.3f} tokens/s); "
        f"concurrent: {seconds_con:.2f} s ({args.tokens / seconds_con:.3f} tokens/s)"
    )
    print(
        f"concurrent_vs_sequential={seconds_seq / seconds_con:.3f} "
        f"tokens_per_s={args.tokens / seconds_con:.3f}"
    )


if __name__ == "__main__":
    main()
