"""Who pays under per-document filters: the share of payers that are relevant, and the spend.

Under individual accounting (`retriever.rag.individual`) a record pays for an answer when
its filter admits the charge, its public participation coin comes up, and its score for
the question clears the public relevance threshold tau; the charge does not depend on the
answer's text. So the ledger's whole history over a question stream can be replayed
without decoding a token: this script does that, with the same row selection
(`individual_rows`), the same per-answer cost and filter capacity (`open_document_filters`
on a scratch ledger), and the same Zipf stream as `scripts/multi_query_eval.py`, for
dense (all-MiniLM-L6-v2 cosine) and term-overlap (`retriever.lexical.OverlapEncoder`)
scores. A payer is relevant when its record states the asked disease.

Prints per (retrieval, tau): the share of payers that are relevant, the median and largest
record spend (epsilon, as the filters state it), records exhausted, questions whose rows
hold at least one relevant record, and how many relevant records were left out because
they were exhausted. Last line: ``precision_dense=<p> precision_overlap=<p>
median_spend_dense=<eps> median_spend_overlap=<eps>`` (at the default taus).

    python scripts/payer_precision.py --out runs/payer_precision
    python scripts/payer_precision.py --records 350 --diseases 18 --questions 40 --epsilon 2
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from dpsynth.evaluation.stream_eval import zipf_world
from retriever.lexical import OverlapEncoder
from retriever.rag import RagConfig, ScoreRange
from retriever.rag.collection import open_document_filters
from retriever.rag.config import plan_answer
from retriever.rag.individual import individual_rows
from synthgen.privacy import PrivacyLedger
from synthgen.privacy.document_filters import DocumentFilters


def filter_capacity(config: RagConfig, epsilon: float, records: int, target) -> tuple:
    """(answers per record, per-answer rho, budget) exactly as the ledger opens them."""
    with tempfile.TemporaryDirectory() as tmp:
        ledger = PrivacyLedger(Path(tmp) / "ledger.sqlite")
        plan = plan_answer(config, "icl", epsilon)
        open_document_filters(
            ledger, "records", documents=records, epsilon=target[0], delta=target[1], plan=plan
        )
        record = DocumentFilters(ledger.store).get("records")
        return record.answers_per_document, record.answer_rho, record.budget


def replay(scores, relevant, config: RagConfig, capacity: int, seed: int) -> dict:
    """The filters' history over the stream: payers per answer, relevant or not."""
    n = scores.shape[1]
    paid = np.zeros(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    payers_total = relevant_payers = rows_with_relevant = 0
    left_out = 0
    for q in range(scores.shape[0]):
        active = paid < capacity
        coins = rng.random(n) < config.participation
        _, weights, payers = individual_rows(
            scores[q], config.relevance_threshold, config.voters, active & coins,
            config.score_range,
        )  # fmt: skip
        paid += payers
        payers_total += int(payers.sum())
        relevant_payers += int((payers & relevant[q]).sum())
        rows_with_relevant += bool((payers & relevant[q]).any())
        left_out += int((~active & coins & relevant[q]).sum())
    return {
        "paid": paid,
        "payers": payers_total,
        "precision": relevant_payers / max(payers_total, 1),
        "questions_with_relevant_rows": rows_with_relevant / scores.shape[0],
        "relevant_left_out_exhausted": left_out,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for results.json")
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--diseases", type=int, default=60)
    parser.add_argument("--questions", type=int, default=1000)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--epsilon", type=float, default=5.0, help="per-answer epsilon")
    parser.add_argument("--document-epsilon", type=float, default=10.0)
    parser.add_argument("--document-delta", type=float, default=1e-6)
    parser.add_argument("--participation", type=float, default=0.25)
    parser.add_argument("--voters", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=5, help="icl tokens per answer")
    parser.add_argument("--dense-taus", type=float, nargs="+", default=[0.5, 0.6, 0.7])
    parser.add_argument("--overlap-taus", type=float, nargs="+", default=[0.5, 0.25, 0.75])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    world, stream = zipf_world(
        args.diseases, args.records, args.questions, exponent=args.zipf, seed=args.seed
    )
    texts = [r.text for r in world.records]
    questions = [q.question for q in stream]
    relevant = np.array([[r.disease == q.disease for r in world.records] for q in stream])

    from retriever.evaluate import load_encoder

    encoder = load_encoder("all-minilm-l6-v2")
    dense = encoder.encode(questions) @ encoder.encode(texts).T
    lexical = OverlapEncoder(texts)
    documents = lexical.documents()  # sparse; a question's vector is 2^20 wide: one at a time
    overlap = np.stack([documents @ lexical.encode([q])[0] for q in questions])
    cells = [("dense", tau, dense, ScoreRange(0.2, 1.0)) for tau in args.dense_taus]
    cells += [("overlap", tau, overlap, ScoreRange(0.0, 1.0)) for tau in args.overlap_taus]
    results, lines = {}, []
    header = (
        "| retrieval | tau | answers per record | payers per answer | relevant payers | "
        "median record eps | largest eps | exhausted | questions with a relevant row | "
        "relevant left out (exhausted) |"
    )
    lines = [header, "|---" * (header.count("|") - 1) + "|"]
    for name, tau, scores, score_range in cells:
        config = RagConfig(
            k=args.voters,
            max_voters=args.voters,
            max_tokens=args.max_tokens,
            score_range=score_range,
            composition="bounded-range",
            accounting="individual",
            relevance_threshold=tau,
            participation=args.participation,
        )
        target = (args.document_epsilon, args.document_delta)
        capacity, rho, budget = filter_capacity(config, args.epsilon, len(texts), target)
        out = replay(scores, relevant, config, capacity, args.seed)
        spent = np.array([budget.spent_epsilon(rho * k) for k in out.pop("paid")])
        cell = out | {
            "answers_per_record": capacity,
            "median_epsilon": float(np.median(spent)),
            "max_epsilon": float(spent.max()),
            "exhausted": int((spent >= budget.spent_epsilon(rho * capacity) - 1e-12).sum())
            if capacity
            else 0,
        }
        results[f"{name}@{tau:g}"] = cell
        lines.append(
            f"| {name} | {tau:g} | {capacity} | {cell['payers'] / len(stream):.1f} | "
            f"{cell['precision']:.3f} | {cell['median_epsilon']:.3f} | {cell['max_epsilon']:.2f} "
            f"| {cell['exhausted']} | {cell['questions_with_relevant_rows']:.3f} | "
            f"{cell['relevant_left_out_exhausted']} |"
        )
    print("\n".join(lines))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(
            json.dumps(
                {
                    "cells": results,
                    "config": {
                        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                    },
                },
                indent=1,
            )
        )
    d, o = results[f"dense@{args.dense_taus[0]:g}"], results[f"overlap@{args.overlap_taus[0]:g}"]
    print(
        f"precision_dense={d['precision']:.3f} precision_overlap={o['precision']:.3f} "
        f"median_spend_dense={d['median_epsilon']:.3f} "
        f"median_spend_overlap={o['median_epsilon']:.3f}"
    )


if __name__ == "__main__":
    main()
