"""Tokens/s of DP few-shot generation: batched KV-cache decoding vs re-running every prompt.

One synthetic example, M subsets of n-shot prompts built from wiki-summaries-en lead
paragraphs (each shot cut to --shot-tokens, so a prompt is ~n * shot_tokens tokens), plus the
public prompt: M + 1 rows. The cached path prefills the rows once and then runs one jitted
KV-cache step per released token (`FlaxLM.start` / `append`); the naive path runs the full
forward of every prompt + generated tokens for each token (`FlaxLM.score`). Both release
tokens with the same Gaussian mechanism (`fewshot.release_token`) and run a fixed number of
tokens (no early stop). Compilation is excluded (one warm-up call of each path).

    python scripts/bench_fewshot.py            # smollm2-135m-instruct, M=10, 4-shot, ~400 tokens

Last line: ``cached_vs_naive=<ratio> tokens_per_s=<cached tokens/s>``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from synthgen import corpora, fewshot
from synthgen.fewshot.prompts import _Prompts
from synthgen.lm_backends import FlaxLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--subsets", type=int, default=10)
    parser.add_argument("--shots", type=int, default=4)
    parser.add_argument("--shot-tokens", type=int, default=96)
    parser.add_argument("--tokens", type=int, default=32, help="tokens of the cached path")
    parser.add_argument("--naive-tokens", type=int, default=6, help="tokens of the naive path")
    args = parser.parse_args()

    lm = FlaxLM.load(args.model)
    docs = corpora.load_wiki_summaries("wiki-summaries-en")
    rows = [{"text": d, "label": t} for d, t in zip(docs["document"], docs["topic"], strict=True)]
    cfg = fewshot.FewShotConfig(
        subsets=args.subsets,
        shots=args.shots,
        max_shots=args.shots,
        shot_tokens=args.shot_tokens,
        max_new_tokens=args.tokens,
        noise_multiplier=1.0,
        public_vocab=100,
        resample="example",
        public_pool_size=len(rows),  # a benchmark: the corpus is public, its size too
    )
    plan = fewshot.plan_privacy(cfg, args.tokens)
    prompts = _Prompts(lm, fewshot.DOCUMENT_TEMPLATE, rows, cfg.shot_tokens)
    frame = prompts.frame({"label": "History"})
    shots = np.arange(args.subsets * args.shots).reshape(args.subsets, args.shots)
    batch = [prompts.prompt(frame, [])] + [prompts.prompt(frame, s.tolist()) for s in shots]
    lengths = [len(p) for p in batch[1:]]
    print(
        f"rows={len(batch)} private prompt tokens: mean={np.mean(lengths):.0f} max={max(lengths)}",
        flush=True,
    )
    rng = np.random.default_rng(0)

    def cached(tokens: int) -> float:
        start = time.perf_counter()
        logprobs = lm.start(batch, args.tokens)
        for i in range(tokens):
            token = fewshot.release_token(logprobs, cfg, plan, rng)
            if i + 1 < tokens:
                logprobs = lm.append(token)
        return time.perf_counter() - start

    def naive(tokens: int) -> float:
        start, generated = time.perf_counter(), []
        for _ in range(tokens):
            logprobs = lm.score([p + generated for p in batch])
            generated.append(fewshot.release_token(logprobs, cfg, plan, rng))
        return time.perf_counter() - start

    cached(2), naive(1)  # compile
    cached_s = cached(args.tokens)
    naive_s = naive(args.naive_tokens)
    cached_rate, naive_rate = args.tokens / cached_s, args.naive_tokens / naive_s
    print(
        f"cached: {args.tokens} tokens in {cached_s:.1f}s = {cached_rate:.3f} tok/s "
        f"(prefill included)"
    )
    print(f"naive: {args.naive_tokens} tokens in {naive_s:.1f}s = {naive_rate:.3f} tok/s")
    print(f"cached_vs_naive={cached_rate / naive_rate:.2f} tokens_per_s={cached_rate:.3f}")


if __name__ == "__main__":
    main()
