"""Seconds per DP-RAG answer token: one batched KV-cache step for all prompts vs one at a time.

The answer stage (`retriever.rag.DPRag`, icl mechanism) with k = 32 selected documents
(fictional medical records of `dpsynth.evaluation.medical_world`; random embeddings and a threshold
epsilon so large that the DP threshold selects exactly k) and the public prompt. The
batched path is the library's: all 32 private prompts prefilled in one call and advanced
by one jitted cached step per token, the public prompt in its own session. The sequential
path runs the same answer code with an LM wrapper that gives every prompt its own batch-1
KV-cache session, so each token costs 32 + 1 cached steps. EOS is hidden so both paths
release exactly --tokens tokens; compilation is excluded (one warm-up answer per path).

At the fixed public shape every prompt holds ``max_document_tokens`` of document, so the
prefill (the same FLOPs on both paths) is most of a 16-token answer. With
``--document-cache`` both paths read every document's keys and values computed once before
any answer (the deployment setting of `DPRag(document_cache=True)`; the one-off cost is
printed), so an answer runs only the question's tokens and the answer's steps: the
comparison the batched step is for. It skips the timing-channel part.

Then the timing channel: median answer latency with M = 0, 1 and k selected documents
(a collection whose scores make the DP threshold select exactly M), every answer at the
service's fixed public shape (`retriever.rag.answer`); ``latency_spread`` is the largest
median over the smallest (target <= 1.1: latency does not tell how many documents the
private collection held for the question).

    python scripts/bench_rag.py                 # smollm2-135m-instruct, k=32, 16 tokens
    python scripts/bench_rag.py --model tiny --repeats 20   # the byte-level test LM
    python scripts/bench_rag.py --document-cache --documents 100   # keys computed once

Last lines: ``batched_vs_sequential=<ratio> seconds_per_token=<batched seconds per token>``
and ``latency_spread=<max/min median latency over M in {0, 1, k}>``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dpsynth.evaluation.medical_world import MedicalWorldConfig, make_world
from retriever.rag import DPRag, RagConfig, ScoreRange
from synthgen.lm_backends import FlaxLM, TinyLM


class NoStop:
    """Delegates to an LM but reports no EOS, so an answer runs to max_tokens."""

    def __init__(self, lm) -> None:
        self.lm = lm

    def __getattr__(self, name):
        return getattr(self.lm, name)

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return ()

    def fork(self):
        return type(self)(self.lm.fork())


class OneRowAtATime(NoStop):
    """Every prompt in its own batch-1 KV-cache session (the sequential baseline)."""

    def __init__(self, lm) -> None:
        super().__init__(lm)
        self.rows: list = []

    def start(self, prompts, max_new_tokens, **kwargs):
        self.rows = [self.lm.fork() for _ in prompts]
        return np.concatenate([r.start([p], max_new_tokens) for r, p in zip(self.rows, prompts)])

    def start_documents(self, kv, rows, suffix, max_new_tokens):
        self.rows = [self.lm.fork() for _ in rows]
        pairs = zip(self.rows, rows, strict=True)
        firsts = [r.start_documents(kv, [i], suffix, max_new_tokens) for r, i in pairs]
        return np.concatenate(firsts)

    def append(self, token):
        return np.concatenate([r.append(token) for r in self.rows])


def timed_answer(rag: DPRag, question: str, epsilon: float) -> tuple[float, int]:
    start = time.perf_counter()
    answer = rag.answer(question, tenant="bench", epsilon=epsilon, mechanism="icl")
    return time.perf_counter() - start, answer.tokens


def latency_spread(lm, texts: list[str], k: int, tokens: int, repeats: int) -> float:
    """max/min over M in {0, 1, k} of the median answer latency with exactly M selected."""
    n = len(texts)
    embeddings = np.eye(n, dtype=np.float32)  # document i scores 1 on axis i, else 0
    config = RagConfig(k=k, max_tokens=tokens, score_range=ScoreRange(0.0, 1.0))
    medians = {}
    for selected in (0, 1, k):
        question = np.zeros((1, n), np.float32)
        question[0, :selected] = 1.0  # M documents at score 1, the rest at 0: tau selects M
        rag = DPRag(
            [str(i) for i in range(n)],
            texts,
            embeddings,
            lambda qs, q=question: q,
            lm,
            config=config,
            rng=np.random.default_rng(2),
        )
        rag.answer("warm-up?", tenant="bench", epsilon=10.0, mechanism="icl")
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            rag.answer("What does the patient have?", tenant="bench", epsilon=10.0)
            times.append(time.perf_counter() - start)
        medians[selected] = float(np.median(times))
        print(f"selected={selected}: median {1e3 * medians[selected]:.2f} ms", flush=True)
    return max(medians.values()) / min(medians.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="an LM asset or 'tiny'")
    parser.add_argument("--k", type=int, default=32, help="selected documents")
    parser.add_argument("--tokens", type=int, default=16, help="answer tokens")
    parser.add_argument("--documents", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--document-cache",
        action="store_true",
        help="both paths read every document's keys computed once before any answer "
        "(DPRag's document_cache), so an answer runs only the question and its tokens",
    )
    args = parser.parse_args()

    world = make_world(MedicalWorldConfig(num_records=args.documents, seed=0))
    texts = [r.text for r in world.records]
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(len(texts), 16)).astype(np.float32)
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    question_vector = embeddings[0:1]
    config = RagConfig(
        k=args.k,
        max_tokens=args.tokens,
        retrieval_share=0.99,  # a benchmark: epsilon 100 * 0.99 on the threshold selects k
        score_range=ScoreRange(-1.0, 1.0),
    )
    base = TinyLM() if args.model == "tiny" else FlaxLM.load(args.model)
    question = world.questions(per_disease=1, seed=0)[0].question
    results = {}
    cache = args.document_cache or False
    for name, lm in (("batched", NoStop(base)), ("sequential", OneRowAtATime(base))):
        start = time.perf_counter()
        rag = DPRag(
            [r.doc_id for r in world.records],
            texts,
            embeddings,
            lambda qs: question_vector,
            lm,
            config=config,
            rng=np.random.default_rng(1),
            document_cache=cache,
        )
        if cache is True:
            print(f"document keys: {time.perf_counter() - start:.1f} s, once per collection")
            cache = rag.document_kv  # the sequential path reads the same keys
        timed_answer(rag, question, 100.0)  # warm-up: compilation
        runs = [timed_answer(rag, question, 100.0) for _ in range(args.repeats)]
        seconds = min(t / n for t, n in runs)
        results[name] = seconds
        print(f"{name}: {seconds:.4f} s/token (tokens per answer: {runs[0][1]})", flush=True)
    ratio = results["sequential"] / results["batched"]
    print(f"batched_vs_sequential={ratio:.2f} seconds_per_token={results['batched']:.4f}")
    if args.document_cache:
        return
    spread = latency_spread(NoStop(base), texts, args.k, args.tokens, args.repeats)
    print(f"latency_spread={spread:.3f}")


if __name__ == "__main__":
    main()
