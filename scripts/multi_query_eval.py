"""A stream of DP-RAG questions: individual (per-document) versus collection accounting.

On a `dpsynth.evaluation.medical_world` world (by default the DP-RAG evaluation's: 2,000
records over
60 diseases, seed 0, embedded with all-MiniLM-L6-v2), a stream of questions drawn with
repetition (Zipf over diseases ranked by support, paraphrased templates;
`dpsynth.evaluation.stream_eval.zipf_stream`) is answered with icl at one per-answer epsilon,
twice, each against its own SQLite ledger:

* individual: every record has an (epsilon, delta) = (--document-epsilon, --document-delta)
  filter; records scoring at least the public relevance threshold pay, the others nothing;
* collection: one collection cap at the same (epsilon, delta) over all answers; the DP
  top-k threshold retrieves (10% of each answer's epsilon);
* individual+reuse (with ``--modes``): individual, and a question asked again (same text
  up to case, spacing and final punctuation) gets the answer released the first time,
  for free (`retriever.rag.reuse`: post-processing).

Both state the same guarantee for every record. Cells that pay nothing per answer:

* release (``--release-epsilons``): the collection's facts released once
  (`synthgen.knowledge.facts`: pairs of key phrases, K = ``--release-max-pairs`` per
  record, as measured on this world) at each per-record epsilon, then every question
  answered from the release (`retriever.fact_answers`: the public LM picks a partner of
  the phrases the question names, or abstains). The cluster release (DP-SynRAG) this
  cell ran before was retired (docs/guides/knowledge.md);
* rag: non-private RAG over the private records (the reference);
* no-rag: the LM alone.

Reports for each: questions answered before refusals begin, accuracy over the stream
(refusals and abstentions count as wrong), on the first and last 100 questions, by
support bin, records exhausted; for releases their minutes, the process's peak memory and
the number of synthetic records. Writes ``results.json``, ``table.md`` and
``cumulative_accuracy.png`` to --out. Resumable: rerun the same command (an answer
interrupted after its charge is charged again when it is re-asked; a release is kept in
--out and drawn once).

    python scripts/multi_query_eval.py --out runs/knowledge_stream --retrieval bm25 \
        --modes rag no-rag release --release-epsilons 10 3 1 --individual-accuracy 0.006
    python scripts/multi_query_eval.py --out runs/multi_query_eval --modes collection individual
    python scripts/multi_query_eval.py --out runs/multi_query_eval --replot   # the plot only

Last line with a release: ``release_eps10=<acc> release_eps3=<acc> release_eps1=<acc>
rag=<acc> individual_eps10=<acc> release_minutes_<records>=<minutes>``; else
``answered_individual=<n> answered_collection=<n> accuracy_individual=<acc>
accuracy_collection=<acc>``.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np

from dpsynth.evaluation.rag_eval import MEDICAL_PROMPT
from dpsynth.evaluation.stream_eval import (
    TENANT,
    answered,
    plot_streams,
    run_stream,
    single_answer_accuracy,
    stream_summary,
    zipf_world,
)
from retriever.rag import AggregationConfig, DPRag, RagConfig, ScoreRange
from retriever.rag.collection import open_document_filters
from retriever.rag.reuse import ReleasedAnswers
from synthgen.privacy import COLLECTION, PrivacyLedger, Scope
from synthgen.privacy.receipts import collection_payer


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
        default=["rag", "no-rag", "release"],
        choices=["collection", "individual", "individual+reuse", "rag", "no-rag", "release"],
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
    parser.add_argument(
        "--release-epsilons", type=float, nargs="+", default=[10.0, 3.0, 1.0],
        help="release: per-record epsilon of each one-time release (delta: --document-delta)",
    )  # fmt: skip
    parser.add_argument(
        "--release-max-pairs", type=int, default=16,
        help="release: K, pairs of key phrases one record contributes (16: the medical "
        "world's best, docs/results/tables.md)",
    )  # fmt: skip
    parser.add_argument("--rag-k", type=int, default=8, help="rag: records read per answer")
    parser.add_argument(
        "--retrieval", choices=["dense", "bm25"], default="dense",
        help="rag cells: all-MiniLM-L6-v2 cosine, or BM25 (retriever.lexical)",
    )  # fmt: skip
    parser.add_argument(
        "--individual-accuracy", type=float, default=None,
        help="the individual cell's stream accuracy measured earlier (the results page), "
        "for the last line and the plot when this run has no individual cell",
    )  # fmt: skip
    parser.add_argument(
        "--replot", action="store_true",
        help="only redraw cumulative_accuracy.png from --out's results.json and its "
        "streams/*.jsonl (the per-question rows, operator-only); nothing is answered",
    )  # fmt: skip
    args = parser.parse_args()
    if args.replot:
        replot(args.out)
        return

    from retriever.encoders import load_encoder
    from synthgen.lm_backends import FlaxLM

    args.out.mkdir(parents=True, exist_ok=True)
    world, stream = zipf_world(
        args.diseases, args.records, args.questions, exponent=args.zipf, seed=args.seed
    )
    texts = [r.text for r in world.records]
    ids = [r.doc_id for r in world.records]
    others = [d.name for d in world.diseases]
    summaries, streams, document_kv = {}, {}, None
    encoder = lm = None  # loaded only when a stream has questions left
    for mode in args.modes:
        if mode in ("rag", "no-rag", "release"):
            if encoder is None:
                encoder = load_encoder("all-minilm-l6-v2")
                lm = FlaxLM.load(args.model)
            _free_cells(mode, args, world, stream, encoder, lm, summaries, streams, others)
            continue
        rows = answered(args.out / "streams", mode)
        if len(rows) >= len(stream):  # finished: only the report is left
            rows = rows[: len(stream)]
            summaries[mode], streams[mode] = stream_summary(rows), rows
            continue
        if encoder is None:
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
            payer=collection_payer(ledger, "records"),
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
    plot(config, streams, single, args.out / "cumulative_accuracy.png")
    free = any(m in args.modes for m in ("rag", "no-rag", "release"))
    print(table)
    if free:
        individual = summaries.get("individual", {}).get("accuracy", args.individual_accuracy)
        parts = [
            f"release_eps{e:g}={summaries.get(f'release-eps{e:g}', {}).get('accuracy', 0.0):.3f}"
            for e in args.release_epsilons
        ]
        parts.append(f"rag={summaries.get('rag', {}).get('accuracy', 0.0):.3f}")
        parts.append("individual_eps10=" + ("n/a" if individual is None else f"{individual:.3f}"))
        top = summaries.get(f"release-eps{max(args.release_epsilons):g}", {})
        parts.append(f"release_minutes_{args.records}={top.get('release_minutes', 0.0):.1f}")
        print(" ".join(parts))
        return
    ind, col = summaries.get("individual", {}), summaries.get("collection", {})
    print(
        f"answered_individual={ind.get('answered', 0)} answered_collection="
        f"{col.get('answered', 0)} accuracy_individual={ind.get('accuracy', 0.0):.3f} "
        f"accuracy_collection={col.get('accuracy', 0.0):.3f}"
    )


def plot(config: dict, streams: dict[str, list[dict]], single: dict | None, path: Path) -> None:
    """The cumulative accuracy plot of a run: its streams, and the single-answer and
    earlier individual-accounting accuracies as reference lines.

    `config` is the run's settings as results.json stores them (``vars(args)``). The y-range
    holds every curve and line: a stream whose first answer is right starts at 1.
    """
    references = {}
    if single is not None:
        references[f"single answers, uniform over diseases ({single['uniform']:.2f})"] = single[
            "uniform"
        ]
        references[f"single answers, weighted by the stream ({single['stream_mix']:.2f})"] = single[
            "stream_mix"
        ]
    individual = config.get("individual_accuracy")
    if individual is not None and "individual" not in streams:
        label = f"query-time icl, individual filters, eps=10 per record ({individual:.3f})"
        references[label] = individual
    free = any(m in config["modes"] for m in ("rag", "no-rag", "release"))
    peak = max(
        [
            float(np.max(np.cumsum(correct) / np.arange(1, len(correct) + 1)))
            for correct in ([bool(r["correct"]) for r in rows] for rows in streams.values())
            if correct
        ]
        + list(references.values()),
        default=1.0,
    )
    records, delta = config["records"], config["document_delta"]
    plot_streams(
        streams,
        path,
        f"{config['questions']} questions over {records} records "
        f"({config.get('retrieval', 'dense')} retrieval)\n"
        f"release-epsE: one release at (E, {delta:g})-DP per record; rag: not private"
        if free
        else f"icl at eps={config['epsilon']:g} per answer; every record "
        f"({config['document_epsilon']:g}, {delta:g})-DP; {records} records",
        ymax=min(1.0, peak) * 1.05,
        references=references or None,
    )


def replot(out: Path) -> None:
    """Redraws `out`/cumulative_accuracy.png from `out`/results.json and its stream rows."""
    results = json.loads((out / "results.json").read_text())
    streams = {name: answered(out / "streams", name) for name in results["summaries"]}
    missing = [name for name, rows in streams.items() if not rows]
    if missing:
        raise SystemExit(f"no stream rows for {missing} in {out / 'streams'}: run the evaluation")
    plot(results["config"], streams, results["single_answer"], out / "cumulative_accuracy.png")
    print(out / "cumulative_accuracy.png")


def _release(args, name: str, epsilon: float, texts: list[str]) -> dict:
    """The one-time fact release at `epsilon` (cached in <out>/<name>/): its records and
    figures."""
    from synthgen.knowledge.facts import FactConfig, release_facts

    folder = args.out / name
    summary_path = folder / "release.json"
    if summary_path.is_file():
        return json.loads(summary_path.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    config = FactConfig(
        epsilon, args.document_delta, max_pairs=args.release_max_pairs, extractor="phrases"
    )
    start = time.perf_counter()
    release = release_facts(texts, config, work=args.out / "work" / name)
    minutes = (time.perf_counter() - start) / 60
    summary = {
        "epsilon": epsilon,
        "delta": args.document_delta,
        "max_pairs": args.release_max_pairs,
        "release_minutes": minutes,  # of the run that drew it
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "pairs": len(release.pairs),
        "synthetic_records": len(release.records),
        "records": release.records,
    }
    summary_path.write_text(json.dumps(summary, indent=1))
    return summary


def _free_cells(mode, args, world, stream, encoder, lm, summaries, streams, others) -> None:
    """The cells that pay nothing per answer: rag, no-rag, and a release per epsilon."""
    from dpsynth.evaluation.release_eval import (
        accuracy_by_support,
        answer_stream,
        retrieval_answerer,
    )
    from retriever.fact_answers import FactAnswerer

    texts = [r.text for r in world.records]
    cells = {}
    if mode in ("rag", "no-rag"):
        cache = args.out / "record_embeddings.npy"
        if not cache.is_file():
            np.save(cache, encoder.encode(texts, progress=True))
        k = args.rag_k if mode == "rag" else 0
        answer = retrieval_answerer(
            lm, MEDICAL_PROMPT, texts, np.load(cache), encoder.encode, k=k,
            max_tokens=args.max_tokens, max_document_tokens=args.max_document_tokens,
            retrieval=args.retrieval,
        )  # fmt: skip
        cells[mode] = (answer, None)
    else:
        for epsilon in args.release_epsilons:
            name = f"release-eps{epsilon:g}"
            release = _release(args, name, epsilon, texts)
            answerer = FactAnswerer(release["records"], lm)
            cells[name] = (lambda q, a=answerer: a.answer(q).answer, release)
    for name, (answer, release) in cells.items():
        rows = answer_stream(name, answer, stream, out_dir=args.out / "streams", others=others)
        summaries[name] = stream_summary(rows) | {"by_support": accuracy_by_support(rows)}
        if release is not None:
            summaries[name] |= {
                key: release[key]
                for key in ("release_minutes", "peak_rss_gib", "synthetic_records", "pairs",
                            "epsilon", "max_pairs")
            }  # fmt: skip
        streams[name] = rows


def _plan(config: RagConfig, epsilon: float):
    from retriever.rag.config import plan_answer

    return plan_answer(config, "icl", epsilon)


if __name__ == "__main__":
    main()
