"""DP-RAG answers on fictional medical records: accuracy, abstention and readability.

Builds a `dpsynth.evaluation.medical_world` world (invented diseases, so SmolLM2 cannot know the
answers; by default 2,000 records over 60 diseases whose supports span 1 to ~300 records,
one question per disease), embeds its records with all-MiniLM-L6-v2, and answers the same
questions with icl and keywords (or any of icl, keywords, facts) at each per-answer epsilon
(each mechanism with its own k), next to non-private RAG (top-k records in one prompt) and
no-RAG. Reports accuracy
by support bin (1-2, 3-9, 10-29, 30-99, 100+) and per cell the readability: share of
answers with U+FFFD or control characters, share of abstentions, and the mean public
log-probability per token of the answers. Resumable per question (rerun the same command);
writes ``results.json``, ``table.md`` and ``accuracy.png`` to --out.

    python scripts/dp_rag_eval.py --out runs/dp_rag_eval

Last line, with keywords among the mechanisms: ``keywords_eps5=<acc> keywords_eps10=<acc>
keywords_support30_eps5=<acc> rag=<acc> rag_support30=<acc> icl_eps10=<acc>``; without:
``cells=<n> best_dp_accuracy=<acc> rag_accuracy=<acc> no_rag_accuracy=<acc>``. (vote,
sparse-vote and answer-vote were retired: docs/guides/dp_rag.md#retired-mechanisms.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from dpsynth.evaluation.medical_world import MedicalWorldConfig, make_world, support_histogram
from dpsynth.evaluation.rag_eval import (
    EvalConfig,
    accuracy_table,
    evaluate_world,
    make_rag,
    markdown_table,
    plot,
)
from retriever.rag import AggregationConfig, RagConfig, ScoreRange
from synthgen.lm_backends import FlaxLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/dp_rag_eval"))
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--diseases", type=int, default=60)
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--questions-per-disease", type=int, default=1)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0, 5.0, 10.0])
    parser.add_argument(
        "--mechanisms",
        nargs="+",
        default=["icl", "keywords"],
        choices=["icl", "keywords", "facts"],
        help="any of icl keywords facts (facts: no LM; each record votes its typed facts)",
    )
    parser.add_argument("--k-icl", type=int, default=32, help="icl: documents aimed at")
    parser.add_argument("--k-keywords", type=int, default=64, help="keywords, facts: voters")
    parser.add_argument(
        "--answer-keywords", type=int, default=RagConfig().answer_keywords,
        help="keywords: K, most keywords per voter's answer",
    )  # fmt: skip
    parser.add_argument(
        "--documents-per-voter", type=int, default=1, help="keywords: documents each voter reads"
    )
    parser.add_argument("--rag-k", type=int, default=16, help="non-private RAG's top-k")
    parser.add_argument("--min-score", type=float, default=0.2, help="public lower clip")
    parser.add_argument("--max-tokens", type=int, default=5)
    parser.add_argument("--beta", type=float, default=RagConfig().aggregation.beta)
    parser.add_argument(
        "--beta-fade", type=float, default=RagConfig().aggregation.beta_fade_epsilon
    )
    parser.add_argument("--composition", default="bounded-range", help="icl: pure | bounded-range")
    parser.add_argument(
        "--max-document-tokens", type=int, default=64, help="public cut of a record (<= 54 here)"
    )
    parser.add_argument(
        "--retrieval", choices=["dense", "overlap"], default="dense",
        help="every cell's scores: all-MiniLM-L6-v2 cosine, or term overlap "
        "(retriever.lexical.OverlapEncoder; use --min-score 0)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    pool = max(MedicalWorldConfig.symptom_pool, 3 * args.diseases)
    world = make_world(
        MedicalWorldConfig(
            num_diseases=args.diseases,
            num_records=args.records,
            symptom_pool=pool,
            seed=args.seed,
        )
    )
    questions = world.questions(per_disease=args.questions_per_disease, seed=args.seed)
    rag_config = RagConfig(
        k=args.k_icl,
        max_tokens=args.max_tokens,
        score_range=ScoreRange(args.min_score, 1.0),
        composition=args.composition,
        aggregation=AggregationConfig(beta=args.beta, beta_fade_epsilon=args.beta_fade),
        max_document_tokens=args.max_document_tokens,
        answer_keywords=args.answer_keywords,
        documents_per_voter=args.documents_per_voter,
    )
    encoder = "overlap" if args.retrieval == "overlap" else "all-minilm-l6-v2"
    rag = make_rag(
        world, args.out, lm=FlaxLM.load(args.model), encoder=encoder, config=rag_config,
        seed=args.seed,
    )  # fmt: skip
    eval_config = EvalConfig(
        epsilons=tuple(args.epsilons),
        mechanisms=tuple(args.mechanisms),
        rag_k=args.rag_k,
        mechanism_k=(
            ("icl", args.k_icl),
            ("keywords", args.k_keywords),
            ("facts", args.k_keywords),
        ),
    )
    results = evaluate_world(world, questions, rag, eval_config, args.out, readability=True)
    table = accuracy_table(results)
    (args.out / "results.json").write_text(
        json.dumps(
            {
                "table": table,
                "support_histogram": support_histogram(world),
                "config": {**vars(args), "out": str(args.out)},
            },
            indent=1,
        )
    )
    (args.out / "table.md").write_text(markdown_table(table) + "\n")
    plot(table, eval_config, args.out / "accuracy.png")
    print(markdown_table(table))
    by_cell = {e["cell"]: e["accuracy"] for e in table}
    best = max(v for k, v in by_cell.items() if k not in ("rag", "no-rag"))
    if "keywords" not in args.mechanisms:
        print(
            f"cells={len(table)} best_dp_accuracy={best:.3f} rag_accuracy={by_cell['rag']:.3f} "
            f"no_rag_accuracy={by_cell['no-rag']:.3f}"
        )
        return

    def supported(cell: str) -> float:  # accuracy on facts stated by >= 30 records
        rows = [r for r in results.get(cell, []) if r["support"] >= 30]
        return float(np.mean([r["correct"] for r in rows])) if rows else 0.0

    print(
        f"keywords_eps5={by_cell.get('keywords-eps5', 0.0):.3f} "
        f"keywords_eps10={by_cell.get('keywords-eps10', 0.0):.3f} "
        f"keywords_support30_eps5={supported('keywords-eps5'):.3f} "
        f"rag={by_cell['rag']:.3f} rag_support30={supported('rag'):.3f} "
        f"icl_eps10={by_cell.get('icl-eps10', 0.0):.3f}"
    )


if __name__ == "__main__":
    main()
