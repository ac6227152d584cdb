"""`retriever` command line: thin wrappers over the retriever library."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from retriever import data, rag_cli, service_cli
from synthgen.cli import run

app = typer.Typer(
    help="Retrieval on DP synthetic data.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(
    help="Prepare retrieval datasets in the plain JSONL formats.", no_args_is_help=True
)
index_app = typer.Typer(help="Build and query a nearest-neighbour index.", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(index_app, name="index")
app.add_typer(rag_cli.privacy_app, name="privacy")
app.command("answer")(rag_cli.answer)
app.command("serve")(service_cli.serve)
app.add_typer(service_cli.tenant_app, name="tenant")

# jax, flax, scann and datasets are imported inside the commands so `--help` starts fast.


@data_app.command("wiki")
def data_wiki(
    out: Annotated[Path, typer.Option(help="output folder")],
    source: Annotated[str, typer.Option(help="asset name or path")] = "wiki-summaries-en",
    test_fraction: Annotated[float, typer.Option(help="held-out share of documents")] = 0.2,
    seed: Annotated[int, typer.Option(help="split seed")] = 0,
    limit: Annotated[int | None, typer.Option(help="first N documents only")] = None,
) -> None:
    """Write corpus.jsonl and train/test query files for the wiki summaries."""
    counts = data.export_wiki(
        out, source=source, test_fraction=test_fraction, seed=seed, limit=limit
    )
    print(json.dumps(counts))


def _pairs(pairs: Path, corpus: Path | None, limit: int | None):
    """(queries, documents, doc_ids) from a generator output (doc_id, document, query) or a
    plain queries.jsonl joined with --corpus."""
    from retriever.evaluate import read_corpus
    from synthgen.corpora import load_jsonl

    rows = load_jsonl(pairs, required=("query", "doc_id")).to_list()
    if limit:
        rows = rows[:limit]
    if all("document" in r for r in rows):
        return (
            [r["query"] for r in rows],
            [r["document"] for r in rows],
            [str(r["doc_id"]) for r in rows],
        )
    if corpus is None:
        raise ValueError(f"{pairs} has no document field: pass --corpus corpus.jsonl")
    doc_ids, texts = read_corpus(corpus)
    text_of = dict(zip(doc_ids, texts))
    missing = sum(1 for r in rows if str(r["doc_id"]) not in text_of)
    if missing:
        raise ValueError(f"{missing} pairs name a doc_id that is not in {corpus}")
    return (
        [r["query"] for r in rows],
        [text_of[str(r["doc_id"])] for r in rows],
        [str(r["doc_id"]) for r in rows],
    )


@app.command("train")
def train(
    pairs: Annotated[Path, typer.Option(help="queries.jsonl (generator output or plain)")],
    out: Annotated[Path, typer.Option(help="output folder (resumes from its checkpoints)")],
    encoder: Annotated[str, typer.Option(help="base encoder: asset or folder")] = (
        "all-minilm-l6-v2"
    ),
    corpus: Annotated[Path | None, typer.Option(help="corpus.jsonl for plain pairs")] = None,
    epochs: Annotated[float, typer.Option()] = 1.0,
    batch_size: Annotated[int, typer.Option()] = 32,
    learning_rate: Annotated[float, typer.Option()] = 5e-5,
    temperature: Annotated[float, typer.Option()] = 0.05,
    learn_temperature: Annotated[bool, typer.Option()] = False,
    separate_towers: Annotated[bool, typer.Option()] = False,
    limit: Annotated[int | None, typer.Option(help="first N pairs only")] = None,
    seed: Annotated[int, typer.Option(help="data order")] = 0,
) -> None:
    """Train a dual encoder with in-batch softmax (non-private: for synthetic pairs)."""
    from retriever.encoders import load_encoder
    from retriever.train import RetrieverConfig, train_retriever

    config = RetrieverConfig(
        batch_size=batch_size,
        epochs=epochs,
        learning_rate=learning_rate,
        temperature=temperature,
        learn_temperature=learn_temperature,
        separate_towers=separate_towers,
        seed=seed,
    )
    queries, documents, doc_ids = _pairs(pairs, corpus, limit)
    result = train_retriever(
        load_encoder(encoder), queries, documents, config, doc_ids=doc_ids, out_dir=out
    )
    print(
        json.dumps(
            {
                "out": str(out),
                "steps": result.steps_run,
                "pairs_per_second": round(result.pairs_per_second, 2),
                "seconds": round(result.seconds, 1),
            }
        )
    )


@app.command("train-dp")
def train_dp(
    queries: Annotated[Path, typer.Option(help="private queries.jsonl (query, doc_id)")],
    corpus: Annotated[Path, typer.Option(help="public corpus.jsonl")],
    out: Annotated[Path, typer.Option(help="release folder: towers and privacy metadata")],
    encoder: Annotated[str, typer.Option(help="base encoder")] = "all-minilm-l6-v2",
    epsilon: Annotated[float | None, typer.Option(help="target epsilon")] = 8.0,
    noise_multiplier: Annotated[float | None, typer.Option(help="sigma instead")] = None,
    delta: Annotated[float | None, typer.Option(help="default 1/(2n)")] = None,
    epochs: Annotated[float, typer.Option()] = 1.0,
    batch_size: Annotated[int, typer.Option(help="expected batch size")] = 64,
    clip_norm: Annotated[float, typer.Option()] = 1.0,
    learning_rate: Annotated[float, typer.Option()] = 1e-3,
    ledger: Annotated[
        str | None, typer.Option(help="ledger: file, sqlite:///... or postgresql://...")
    ] = None,
    tenant: Annotated[str, typer.Option()] = "default",
    dataset: Annotated[str | None, typer.Option(help="default: the queries file name")] = None,
    seed: Annotated[int | None, typer.Option(help="tests only; default OS entropy")] = None,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            help="SECRET work folder: resume state incl. the noise key and sampler state; "
            "never ship it (default: <ledger folder>/work/<out name>-<hash>)"
        ),
    ] = None,
    keep_work: Annotated[
        bool, typer.Option(help="keep the secret work folder after a finished run")
    ] = False,
) -> None:
    """Direct-DP baseline: DP-Adafactor on real pairs (frozen public document tower).

    The release folder --out gets the towers only; the resume state (noise key, sampler
    state, optimizer) stays in the secret --work-dir, which is deleted after a finished run
    (unless --keep-work) and resumed from when the same command is run again.
    """
    from retriever.encoders import load_encoder
    from retriever.evaluate import read_corpus, read_queries
    from retriever.train import RetrieverConfig, train_retriever_dp
    from synthgen import dp_train
    from synthgen.paths import default_ledger_path, default_work_dir
    from synthgen.privacy.ledger import PrivacyLedger, Scope

    if noise_multiplier is not None:
        epsilon = None
    dp_config = dp_train.DPConfig(
        batch_size=batch_size,
        epochs=epochs,
        clip_norm=clip_norm,
        learning_rate=learning_rate,
        target_epsilon=epsilon,
        noise_multiplier=noise_multiplier,
        delta=delta,
        physical_batch=16,
        microbatch=8,
        seed=seed,
    )
    rows = read_queries(queries)
    doc_ids, texts = read_corpus(corpus)
    row_of = {d: i for i, d in enumerate(doc_ids)}
    missing = sum(1 for r in rows if str(r["doc_id"]) not in row_of)
    if missing:
        raise ValueError(f"{missing} queries name a doc_id that is not in {corpus}")
    plan = dp_train.plan_privacy(dp_config, len(rows))
    book = PrivacyLedger(ledger or default_ledger_path())
    scope = (tenant, dataset or queries.stem)
    book.ensure_scope(Scope(*scope, plan.epsilon, plan.delta, relation=plan.relation))
    work = work_dir if work_dir is not None else default_work_dir(out, book.path)
    result = train_retriever_dp(
        load_encoder(encoder),
        [r["query"] for r in rows],
        [row_of[str(r["doc_id"])] for r in rows],
        texts,
        RetrieverConfig(),
        dp_config,
        out_dir=out,
        ledger=book,
        ledger_scope=scope,
        work_dir=work,
        keep_work=keep_work,
        plan=plan,
    )
    summary = {
        "out": str(out),
        "steps": result.steps_run,
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "noise_multiplier": plan.noise_multiplier,
    }
    if work.exists():
        summary["work_dir"] = str(work)  # secret: kept, or an unfinished run to resume
    print(json.dumps(summary))


@app.command("evaluate")
def evaluate(
    encoder: Annotated[str, typer.Option(help="asset, encoder folder or trained checkpoint")],
    corpus: Annotated[Path, typer.Option(help="corpus.jsonl: doc_id, text")],
    queries: Annotated[Path, typer.Option(help="queries.jsonl: query, doc_id")],
    index: Annotated[str, typer.Option(help="exact | scann | scann-bf")] = "exact",
    k: Annotated[int, typer.Option(help="cut-off of the metrics")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
    out: Annotated[Path | None, typer.Option(help="also write the report here")] = None,
) -> None:
    """NDCG@k, Recall@k and MRR@k of an encoder on held-out (query, document) pairs."""
    from retriever import evaluate as ev

    doc_ids, texts = ev.read_corpus(corpus)
    report = ev.evaluate(encoder, doc_ids, texts, ev.read_queries(queries), index=index, k=k)
    if out is not None:
        out.write_text(json.dumps(report, indent=1))
    if as_json:
        print(json.dumps(report))
    else:
        print(
            " ".join(
                f"{name}={report[name]:.4f}" for name in (f"ndcg@{k}", f"recall@{k}", f"mrr@{k}")
            )
            + f" (queries={report['num_queries']}, documents={report['num_documents']}, "
            f"index={report['index']})"
        )


@index_app.command("build")
def index_build(
    corpus: Annotated[Path, typer.Option(help="corpus.jsonl: doc_id, text")],
    out: Annotated[Path, typer.Option(help="index folder")],
    encoder: Annotated[str, typer.Option(help="asset or trained folder")] = "all-minilm-l6-v2",
    kind: Annotated[str, typer.Option(help="auto | exact | scann | scann-bf")] = "auto",
) -> None:
    """Embed a corpus (batched, jitted) and build a searchable, serialised index."""
    from retriever.evaluate import load_towers, read_corpus
    from retriever.index import build_searcher

    doc_ids, texts = read_corpus(corpus)
    _, doc_encoder = load_towers(encoder)
    embeddings = doc_encoder.encode(texts, progress=True)
    searcher = build_searcher(embeddings, kind=kind)
    out.mkdir(parents=True, exist_ok=True)
    searcher.save(out / "searcher")
    (out / "index.json").write_text(
        json.dumps({"encoder": encoder, "doc_ids": doc_ids, "kind": searcher.kind})
    )
    print(json.dumps({"out": str(out), "documents": len(doc_ids), "kind": searcher.kind}))


@index_app.command("query")
def index_query(
    index: Annotated[Path, typer.Option(help="folder written by `index build`")],
    query: Annotated[list[str], typer.Option(help="query text (repeatable)")],
    k: Annotated[int, typer.Option()] = 10,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Top-k documents of each query from a built index."""
    from retriever.evaluate import load_towers
    from retriever.index import load_searcher

    meta_path = index / "index.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"no index in {index} (missing index.json)")
    meta = json.loads(meta_path.read_text())
    query_encoder, _ = load_towers(meta["encoder"])
    searcher = load_searcher(index / "searcher")
    scores, found = searcher.search(query_encoder.encode(query), k)
    results = [
        [{"doc_id": meta["doc_ids"][i], "score": float(s)} for s, i in zip(srow, irow) if i >= 0]
        for srow, irow in zip(scores, found)
    ]
    if as_json:
        print(json.dumps([{"query": q, "results": r} for q, r in zip(query, results)]))
        return
    for q, r in zip(query, results):
        print(q)
        for rank, hit in enumerate(r, start=1):
            print(f"  {rank:2d}. {hit['doc_id']}  {hit['score']:.4f}")


def main() -> None:
    """Console script `retriever`."""
    sys.exit(run(app))


if __name__ == "__main__":
    main()
