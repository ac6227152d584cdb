"""Single DP-RAG answers over a fact world (`dpsynth.evaluation.fact_world`), the way `retriever
answer` gives them.

`single_answers(documents, questions, epsilon)` builds what `retriever answer` builds by
default (an exact dense index of the documents under the all-MiniLM-L6-v2 asset, SmolLM2-135M-
Instruct with the chat prompt, `retriever.rag.defaults.resolve` for ``mechanism="auto"`` and
its k) and answers each question once, each its own (epsilon, delta) event: no ledger, the
evaluation needs no shared budget. ``python -m dpsynth.evaluation.single_fact_eval --domain people``
prints the accuracy of a world's questions at the given support levels (a fact world's or a
natural-text world's, `dpsynth.evaluation.natural_world`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import numpy as np

DEFAULT_ENCODER = "all-minilm-l6-v2"
DEFAULT_LM = "smollm2-135m-instruct"

_LOADED: dict[str, object] = {}  # the encoder and LM, loaded once per process


def _load(name: str, loader):
    if name not in _LOADED:
        _LOADED[name] = loader(name)
    return _LOADED[name]


def make_single_rag(
    documents: Sequence[str],
    epsilon: float,
    *,
    delta: float = 1e-6,
    mechanism: str = "auto",
    seed: int | None = None,
    lm=None,
):
    """(DPRag, resolved mechanism) over `documents` as `retriever answer` builds it by
    default (dense retrieval, the default encoder, LM, k, max_tokens and prompt), with no
    ledger. `lm`: a loaded `NextTokenLM` (default: the asset `DEFAULT_LM`)."""
    from retriever.evaluate import load_towers
    from retriever.rag.answer import DPRag
    from retriever.rag.config import RagConfig
    from retriever.rag.defaults import resolve
    from synthgen.lm_backends import FlaxLM

    mechanism, k = resolve(mechanism, None, epsilon)
    query_encoder, doc_encoder = _load(DEFAULT_ENCODER, load_towers)
    embeddings = np.asarray(doc_encoder.encode(list(documents)), np.float32)
    if lm is None:
        lm = _load(DEFAULT_LM, FlaxLM.load)
    config = RagConfig(k=k, max_tokens=12, delta=delta)  # `retriever answer`'s defaults
    rag = DPRag(
        [f"doc-{i:05d}" for i in range(len(documents))],
        list(documents),
        embeddings,
        query_encoder.encode,
        lm,
        config=config,
        rng=None if seed is None else np.random.default_rng(seed),
    )
    return rag, mechanism


def single_answers(
    documents: list[str],
    questions: list[str],
    epsilon: float,
    *,
    delta: float = 1e-6,
    mechanism: str = "auto",
    seed: int | None = None,
) -> list[str]:
    """Each question answered once by the DP-RAG single-answer path over `documents`.

    Args:
      documents: the private collection.
      questions: the questions, each answered on its own.
      epsilon: every answer's epsilon (each question is its own event).
      delta: every answer's delta (below 1 / len(documents)).
      mechanism: "auto" (`retriever answer`'s default) or a mechanism name.
      seed: seeds the threshold's noise (tests and evaluations only; the keywords'
        partition selection draws python-dp's own noise whatever the seed).

    Returns:
      The answers' texts (`ABSTENTION_TEXT` where an answer abstained).

    Privacy:
      Each answer is (epsilon, delta)-DP for one document (add/remove-one), as `DPRag.answer`;
      the answers are not composed (an evaluation, not a release).
    """
    rag, resolved = make_single_rag(documents, epsilon, delta=delta, mechanism=mechanism, seed=seed)
    return [
        rag.answer(q, tenant="eval", epsilon=epsilon, mechanism=resolved).text for q in questions
    ]


def main(argv: Sequence[str] | None = None) -> int:
    from dpsynth.evaluation import fact_world, natural_world

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    domains = fact_world.DOMAINS + natural_world.DOMAINS
    parser.add_argument("--domain", choices=domains, required=True)
    parser.add_argument("--support", type=int, nargs="+", default=[20])
    parser.add_argument("--epsilon", type=float, default=5.0)
    parser.add_argument("--mechanism", default="auto")
    parser.add_argument("--seed", type=int, default=0, help="the world's seed and the noise's")
    args = parser.parse_args(argv)
    if args.domain in natural_world.DOMAINS:
        world = natural_world.make_natural_world(args.domain, seed=args.seed)
        is_right = natural_world.natural_answer_is_right
    else:
        world = fact_world.make_world(args.domain, seed=args.seed)
        is_right = fact_world.answer_is_right
    asked = [q for q in world.questions if q.support in args.support]
    start = time.monotonic()
    answers = single_answers(
        world.documents,
        [q.question for q in asked],
        args.epsilon,
        mechanism=args.mechanism,
        seed=args.seed,
    )
    right = [is_right(a, q.answer) for a, q in zip(answers, asked, strict=True)]
    for q, a, r in zip(asked, answers, right, strict=True):
        print(json.dumps({"question": q.question, "expected": q.answer, "answer": a, "right": r}))
    print(
        json.dumps(
            {
                "domain": args.domain,
                "seed": args.seed,
                "support": args.support,
                "epsilon": args.epsilon,
                "mechanism": args.mechanism,
                "accuracy": sum(right) / max(len(right), 1),
                "questions": len(right),
                "seconds_per_answer": round((time.monotonic() - start) / max(len(right), 1), 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
