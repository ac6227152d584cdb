"""Seconds per answer: keywords against icl at the same k, interleaved question by question.

The DP-RAG evaluation's world (`scripts/dp_rag_eval.py`: 2,000 records of 60 invented
diseases, seed 0), term-overlap retrieval, SmolLM2-135M-Instruct, the evaluation's prompt
and 5 answer tokens, per-answer epsilon 5. For each of the first --questions questions both
mechanisms answer, alternately, so that a busy machine slows both alike; one warm-up answer
each (compilation) is not timed. Both run at the same public shape: k rows (icl: k
prompts decoded token by token; keywords: k voters' greedy answers, one partition
selection, then the public LM's answer).

    python scripts/bench_keywords.py                  # k = 32, 10 questions
    python scripts/bench_keywords.py --k 64

Last line: ``keywords_vs_icl_seconds=<median ratio> k=<k> keywords_s=<median> icl_s=<median>``.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from dpsynth.evaluation.medical_world import MedicalWorldConfig, make_world
from dpsynth.evaluation.rag_eval import make_rag
from retriever.rag import RagConfig, ScoreRange
from synthgen.lm_backends import FlaxLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--epsilon", type=float, default=5.0)
    args = parser.parse_args()

    world = make_world(MedicalWorldConfig(num_diseases=60, num_records=2000, symptom_pool=180))
    questions = world.questions(per_disease=1, seed=0)
    config = RagConfig(
        k=args.k, max_tokens=5, score_range=ScoreRange(0.0, 1.0), max_document_tokens=64,
        composition="bounded-range",
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        rag = make_rag(world, tmp, lm=FlaxLM.load(args.model), encoder="overlap", config=config)
    seconds: dict[str, list[float]] = {"icl": [], "keywords": []}
    for mechanism in seconds:  # warm-up: compilation, not timed
        rag.answer(questions[0].question, tenant="bench", epsilon=args.epsilon, mechanism=mechanism)
    for q in questions[1 : args.questions + 1]:
        for mechanism in seconds:
            start = time.perf_counter()
            rag.answer(q.question, tenant="bench", epsilon=args.epsilon, mechanism=mechanism)
            seconds[mechanism].append(time.perf_counter() - start)
    medians = {m: float(np.median(s)) for m, s in seconds.items()}
    ratios = np.array(seconds["keywords"]) / np.array(seconds["icl"])
    for m, s in seconds.items():
        print(f"{m}: median {medians[m]:.2f} s over {len(s)} answers (k = {args.k})")
    print(
        f"keywords_vs_icl_seconds={float(np.median(ratios)):.2f} k={args.k} "
        f"keywords_s={medians['keywords']:.2f} icl_s={medians['icl']:.2f}"
    )


if __name__ == "__main__":
    main()
