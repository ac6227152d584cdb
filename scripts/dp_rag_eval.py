"""DP-RAG answer accuracy on fictional medical records: mechanisms x epsilon vs non-DP RAG.

Builds a `retriever.rag.medical` world (invented diseases, so SmolLM2 cannot know the
answers), embeds its records with all-MiniLM-L6-v2, and answers the same questions with
icl / vote / sparse-vote at each per-answer epsilon, next to non-private RAG (top-k records
in one prompt) and no-RAG. Resumable per question (rerun the same command); writes
``results.json``, ``table.md`` and ``accuracy.png`` to --out.

    python scripts/dp_rag_eval.py --out runs/dp_rag_eval     # ~40 min on 2 CPU cores

Last line: ``cells=<n> best_dp_accuracy=<acc> rag_accuracy=<acc> no_rag_accuracy=<acc>``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from retriever.rag import AggregationConfig, RagConfig, ScoreRange
from retriever.rag.evaluation import (
    EvalConfig,
    accuracy_table,
    evaluate_world,
    make_rag,
    markdown_table,
    plot,
)
from retriever.rag.medical import MedicalWorldConfig, make_world, support_histogram
from synthgen.lm_backends import FlaxLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/dp_rag_eval"))
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--diseases", type=int, default=20)
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("--questions-per-disease", type=int, default=2)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0, 5.0, 10.0])
    parser.add_argument("--mechanisms", nargs="+", default=["icl", "vote", "sparse-vote"])
    parser.add_argument("--k", type=int, default=16, help="documents the threshold aims at")
    parser.add_argument("--min-score", type=float, default=0.2, help="public lower clip")
    parser.add_argument("--max-tokens", type=int, default=6)
    parser.add_argument("--theta", type=float, default=0.3, help="weight of the public prompt")
    parser.add_argument("--composition", default="bounded-range", help="icl: pure | bounded-range")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    world = make_world(
        MedicalWorldConfig(num_diseases=args.diseases, num_records=args.records, seed=args.seed)
    )
    questions = world.questions(per_disease=args.questions_per_disease, seed=args.seed)
    rag_config = RagConfig(
        k=args.k,
        max_tokens=args.max_tokens,
        score_range=ScoreRange(args.min_score, 1.0),
        composition=args.composition,
        aggregation=AggregationConfig(theta=args.theta),
        num_voters=args.k,  # one document per voter: as many voters as the selection allows
        docs_per_voter=1,
    )
    rag = make_rag(world, args.out, lm=FlaxLM.load(args.model), config=rag_config, seed=args.seed)
    eval_config = EvalConfig(
        epsilons=tuple(args.epsilons), mechanisms=tuple(args.mechanisms), rag_k=args.k
    )
    results = evaluate_world(world, questions, rag, eval_config, args.out)
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
    print(
        f"cells={len(table)} best_dp_accuracy={best:.3f} rag_accuracy={by_cell['rag']:.3f} "
        f"no_rag_accuracy={by_cell['no-rag']:.3f}"
    )


if __name__ == "__main__":
    main()
