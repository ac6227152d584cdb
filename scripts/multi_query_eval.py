"""A stream of DP-RAG questions: individual (per-document) versus collection accounting.

On a `retriever.rag.medical` world (by default the DP-RAG evaluation's: 2,000 records over
60 diseases, seed 0, embedded with all-MiniLM-L6-v2), a stream of questions drawn with
repetition (Zipf over diseases ranked by support, paraphrased templates;
`retriever.rag.stream_eval.zipf_stream`) is answered with icl at one per-answer epsilon,
twice, each against its own SQLite ledger:

* individual: every record has an (epsilon, delta) = (--document-epsilon, --document-delta)
  filter; records scoring at least the public relevance threshold pay, the others nothing;
* collection: one collection cap at the same (epsilon, delta) over all answers; the DP
  top-k threshold retrieves (10% of each answer's epsilon);
* individual+reuse (with ``--modes``): individual, and a question asked again (same text
  up to case, spacing and final punctuation) gets the answer released the first time,
  for free (`retriever.rag.reuse`: post-processing).

Both state the same guarantee for every record. Reports for each: questions answered
before refusals begin, accuracy over the stream (refusals and abstentions count as wrong),
on the first and last 100 questions, records exhausted; writes ``results.json``,
``table.md`` and ``cumulative_accuracy.png`` to --out. Resumable: rerun the same command
(an answer interrupted after its charge is charged again when it is re-asked).

    python scripts/multi_query_eval.py --out runs/multi_query_eval

Last line: ``answered_individual=<n> answered_collection=<n> accuracy_individual=<acc>
accuracy_collection=<acc>``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from retriever.rag import AggregationConfig, DPRag, RagConfig, ScoreRange
from retriever.rag.collection import open_document_filters
from retriever.rag.evaluation import MEDICAL_PROMPT
from retriever.rag.medical import MedicalWorldConfig, make_world
from retriever.rag.reuse import ReleasedAnswers
from retriever.rag.stream_eval import (
    TENANT,
    answered,
    plot_streams,
    run_stream,
    single_answer_accuracy,
    stream_summary,
    zipf_stream,
)
from synthgen.privacy import COLLECTION, PrivacyLedger, Scope


def _table(summaries: dict[str, dict]) -> str:
    head = (
        "| accounting | answered before refusals | accuracy (stream) | first 100 | last 100 "
        "| abstained | refused | records exhausted | answers reused | answer time |"
    )
    lines = [head, "|" + "---|" * 10]
    for mode, s in summaries.items():
        lines.append(
            f"| {mode} | {s['answered']} | {s['accuracy']:.3f} | {s['accuracy_first']:.2f} "
            f"| {s['accuracy_last']:.2f} | {s['abstained']} | {s['refused']} | {s['exhausted']} "
            f"| {s['reused']} | {s['seconds'] / 60:.0f} min |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/multi_query_eval"))
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--diseases", type=int, default=60)
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--questions", type=int, default=1000)
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent over diseases")
    parser.add_argument("--epsilon", type=float, default=5.0, help="per-answer epsilon")
    parser.add_argument("--document-epsilon", type=float, default=10.0)
    parser.add_argument("--document-delta", type=float, default=1e-6)
    parser.add_argument(
        "--relevance-threshold",
        type=float,
        default=0.5,
        help="public tau on the [min-score, 1] scale (0.5: cosine 0.6, chosen on the seed-1 "
        "world: 47%% of same-disease and 1.3%% of other records pass)",
    )
    parser.add_argument(
        "--participation",
        type=float,
        default=0.25,
        help="individual: each record's chance to take part in an answer (and pay)",
    )
    parser.add_argument(
        "--voters", type=int, default=32, help="icl's private prompts (the DP-RAG evaluation's)"
    )
    parser.add_argument("--composition", default="bounded-range", help="pure | bounded-range")
    parser.add_argument("--k", type=int, default=32, help="collection: DP top-k's target")
    parser.add_argument("--min-score", type=float, default=0.2)
    parser.add_argument("--max-tokens", type=int, default=5)
    parser.add_argument("--max-document-tokens", type=int, default=64)
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["collection", "individual"],
        choices=["collection", "individual", "individual+reuse"],
        help="individual+reuse: individual, and a question asked again gets its first "
        "answer (retriever.rag.reuse; kept in memory: after a resume, repeats pay again)",
    )
    parser.add_argument(
        "--single-answer",
        type=Path,
        default=None,
        help="a cell of scripts/dp_rag_eval.py for the same mechanism and epsilon "
        "(cells/icl-eps5.jsonl): its accuracy, uniform and weighted by the stream, is printed",
    )
    parser.add_argument(
        "--no-document-cache",
        dest="document_cache",
        action="store_false",
        help="run every whole prompt (default: the records' keys are computed once, "
        "DPRag(document_cache=True): the prefill runs the question only)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from retriever.encoders import load_encoder
    from synthgen.lm_backends import FlaxLM

    args.out.mkdir(parents=True, exist_ok=True)
    world = make_world(
        MedicalWorldConfig(
            num_diseases=args.diseases,
            num_records=args.records,
            symptom_pool=max(MedicalWorldConfig.symptom_pool, 3 * args.diseases),
            seed=args.seed,
        )
    )
    stream = zipf_stream(world, args.questions, exponent=args.zipf, seed=args.seed)
    texts = [r.text for r in world.records]
    ids = [r.doc_id for r in world.records]
    others = [d.name for d in world.diseases]
    summaries, streams, document_kv = {}, {}, None
    encoder = lm = None  # loaded only when a stream has questions left
    for mode in args.modes:
        rows = answered(args.out / "streams", mode)
        if len(rows) >= len(stream):  # finished: only the report is left
            rows = rows[: len(stream)]
            summaries[mode], streams[mode] = stream_summary(rows), rows
            continue
        if lm is None:
            encoder = load_encoder("all-minilm-l6-v2")
            lm = FlaxLM.load(args.model)
        cache = args.out / "record_embeddings.npy"
        if not cache.is_file():
            np.save(cache, encoder.encode(texts, progress=True))
        embeddings = np.load(cache)
        config = RagConfig(
            k=args.k,
            max_voters=args.voters,
            max_tokens=args.max_tokens,
            score_range=ScoreRange(args.min_score, 1.0),
            composition=args.composition,
            aggregation=AggregationConfig(),
            max_document_tokens=args.max_document_tokens,
            accounting=mode.split("+")[0],
            relevance_threshold=args.relevance_threshold,
            participation=args.participation if mode != "collection" else 1.0,
        )
        ledger = PrivacyLedger(args.out / f"{mode}.sqlite")
        # no quota. Individual: a basic quota composes a charge in O(1) (bounded-range
        # tokens are an (epsilon, delta) event, which rdp cannot compose, and a pld scope
        # recomposes its whole history on every charge)
        individual = config.individual
        accountant = "basic" if individual else "pld"
        ledger.ensure_scope(Scope(TENANT, "records", 1e9, 0.5, accountant=accountant))
        if individual:
            open_document_filters(
                ledger,
                "records",
                documents=len(ids),
                epsilon=args.document_epsilon,
                delta=args.document_delta,
                plan=_plan(config, args.epsilon),
            )
        else:
            ledger.ensure_scope(
                Scope(COLLECTION, "records", args.document_epsilon, args.document_delta)
            )
        rag = DPRag(
            ids,
            texts,
            embeddings,
            encoder.encode,
            lm,
            ledger=ledger,
            dataset="records",
            config=config,
            prompt=MEDICAL_PROMPT,
            document_cache=args.document_cache and (document_kv or True),
            answers=ReleasedAnswers("tenant") if mode.endswith("+reuse") else None,
        )
        document_kv = rag.document_kv  # computed once, shared by the modes
        rows = run_stream(
            mode, rag, stream, epsilon=args.epsilon, out_dir=args.out / "streams", others=others
        )
        summaries[mode], streams[mode] = stream_summary(rows), rows
    single = None
    if args.single_answer is not None:
        cells = [json.loads(line) for line in args.single_answer.read_text().splitlines()]
        single = single_answer_accuracy(cells, stream)
    config = {**vars(args), "out": str(args.out), "single_answer": str(args.single_answer)}
    (args.out / "results.json").write_text(
        json.dumps({"summaries": summaries, "single_answer": single, "config": config}, indent=1)
    )
    table = _table(summaries)
    if single is not None:
        table += (
            f"\n\nsingle-answer accuracy of the same mechanism ({args.single_answer}): "
            f"{single['uniform']:.3f} over its {single['diseases']} diseases, "
            f"{single['stream_mix']:.3f} weighted by the stream's questions"
        )
    (args.out / "table.md").write_text(table + "\n")
    plot_streams(
        streams,
        args.out / "cumulative_accuracy.png",
        f"icl at eps={args.epsilon:g} per answer; every record "
        f"({args.document_epsilon:g}, {args.document_delta:g})-DP; {args.records} records",
        ymax=0.5,  # the first questions' noise is cut, the stream's level is readable
        references=None
        if single is None
        else {
            f"single answers, uniform over diseases ({single['uniform']:.2f})": single["uniform"],
            f"single answers, weighted by the stream ({single['stream_mix']:.2f})": single[
                "stream_mix"
            ],
        },
    )
    print(table)
    ind, col = summaries.get("individual", {}), summaries.get("collection", {})
    print(
        f"answered_individual={ind.get('answered', 0)} answered_collection="
        f"{col.get('answered', 0)} accuracy_individual={ind.get('accuracy', 0.0):.3f} "
        f"accuracy_collection={col.get('accuracy', 0.0):.3f}"
    )


def _plan(config: RagConfig, epsilon: float):
    from retriever.rag.config import plan_answer

    return plan_answer(config, "icl", epsilon)


if __name__ == "__main__":
    main()
