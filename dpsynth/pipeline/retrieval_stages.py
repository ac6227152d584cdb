"""The retrieval stages of the main job: train the dual encoder, evaluate it, index the corpus.

Privacy:
  The encoder is trained on the DP synthetic queries only: post-processing of the generate
  stage's release, so it carries that release's guarantee, stated in encoder/provenance.json
  (`retriever.provenance.synthetic`, from synthetic/metadata.json). The optional real-data
  upper bound is trained on the real train pairs (no guarantee) and stays in the private
  folder. The training runs' resume state is in private/work/train, removed at stage end.
  Evaluation reads held-out real queries: its figures are for the operator, not DP.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np

from dpsynth.pipeline.context import StageContext, fingerprints
from dpsynth.pipeline.stage_shards import finished_shards, remove_shards
from synthgen.corpora import read_jsonl
from synthgen.work_folder import private_folder


def train_stage(ctx: StageContext) -> dict:
    """Trains the dual encoder on the synthetic pairs (and the real upper bound if asked)."""
    from retriever import provenance
    from retriever.encoders import load_encoder
    from retriever.train import train_retriever

    cfg = ctx.config.encoder
    rconfig = cfg.retriever_config()
    synthetic = [
        r for r in read_jsonl(ctx.run.root / "synthetic" / "queries.jsonl") if r["query"].strip()
    ]
    if len(synthetic) < rconfig.batch_size:
        raise ValueError(
            f"only {len(synthetic)} non-empty synthetic queries, fewer than one batch "
            f"({rconfig.batch_size}): generate more or lower encoder.batch_size"
        )
    base = load_encoder(cfg.base)
    metadata = json.loads((ctx.run.root / "synthetic" / "metadata.json").read_text())
    ctx.log("train", f"dual encoder on {len(synthetic)} synthetic pairs (base {cfg.base})")
    # keep_work: a crash later in the stage resumes from the finished run's last checkpoint
    # instead of training again; the work folder goes at the end of the stage.
    work = ctx.run.private / "work" / "train"

    def fit(pairs: list[dict], out_dir: Path, record: dict, name: str):
        """Trains `base` on (query, document) pairs; resumable from `work / name`."""
        return train_retriever(
            base,
            [r["query"] for r in pairs],
            [r["document"] for r in pairs],
            rconfig,
            doc_ids=[r["doc_id"] for r in pairs],
            out_dir=out_dir,
            provenance=record,
            work_dir=work / name,
            keep_work=True,
            progress=ctx.progress,
        )

    record = provenance.synthetic(
        metadata,
        num_pairs=len(synthetic),
        description="DP synthetic queries (run folder synthetic/)",
    )
    result = fit(synthetic, ctx.run.root / "encoder", record, "encoder")
    summary = {
        "synthetic_pairs": len(synthetic),
        "steps": result.steps_run,
        "pairs_per_second": result.pairs_per_second,
        "seconds": result.seconds,
    }
    if cfg.real_upper_bound:
        # Equal size: the real pairs of the same documents, for a like-for-like upper bound.
        used = {r["doc_id"] for r in synthetic}
        real = [
            r
            for r in read_jsonl(ctx.run.private / "data" / "train_pairs.jsonl")
            if r["doc_id"] in used
        ]
        ctx.log("train", f"real-data upper bound on {len(real)} real pairs (not DP, private)")
        record = provenance.real_data(
            num_pairs=len(real), description="real train pairs (the real-data upper bound)"
        )
        out_dir = private_folder(ctx.run.private / "real_encoder")  # owner only
        upper = fit(real, out_dir, record, "real_encoder")
        summary.update(real_pairs=len(real), real_seconds=upper.seconds)
    shutil.rmtree(work, ignore_errors=True)  # resume state: the releases are complete
    return summary


def _corpus(ctx: StageContext) -> tuple[list[str], list[str]]:
    rows = read_jsonl(ctx.run.root / "data" / "corpus.jsonl")
    return [r["doc_id"] for r in rows], [r["text"] for r in rows]


def evaluate_stage(ctx: StageContext) -> dict:
    """NDCG@k / Recall@k / MRR@k on the held-out real queries (exact search) for the
    zero-shot base, the synthetic-trained encoder and the real-data upper bound."""
    from retriever.evaluate import evaluate

    cfg, encoder_cfg = ctx.config.evaluate, ctx.config.encoder
    doc_ids, texts = _corpus(ctx)
    queries = read_jsonl(ctx.run.private / "data" / "test_queries.jsonl")
    if cfg.max_queries is not None:
        queries = queries[: cfg.max_queries]
    encoders = [
        ("zero-shot", encoder_cfg.base, "pretrained base, no training"),
        ("DP synthetic", str(ctx.run.root / "encoder"), "trained on the DP synthetic queries"),
    ]
    if (ctx.run.private / "real_encoder").is_dir():
        encoders.append(
            ("real (upper bound)", str(ctx.run.private / "real_encoder"), "real pairs, no DP")
        )
    rows = []
    for name, path, note in encoders:
        ctx.log("evaluate", f"{name}: {len(queries)} held-out queries, {len(doc_ids)} documents")
        report = evaluate(
            path,
            doc_ids,
            texts,
            queries,
            k=cfg.k,
            max_query_len=encoder_cfg.max_query_len,
            max_doc_len=encoder_cfg.max_doc_len,
            progress=ctx.progress,
        )
        rows.append(
            {
                "encoder": name,
                "note": note,
                "ndcg": report[f"ndcg@{cfg.k}"],
                "recall": report[f"recall@{cfg.k}"],
                "mrr": report[f"mrr@{cfg.k}"],
                "encode_seconds": report["encode_seconds"],
            }
        )
    return {"k": cfg.k, "num_queries": len(queries), "num_documents": len(doc_ids), "rows": rows}


def index_shard(ctx: StageContext, shard, out) -> dict:
    """Shard `shard`'s document embeddings into `out` (`dpsynth.pipeline.stage_shards`)."""
    from retriever.index_shards import encode_index_shard

    count = encode_index_shard(
        ctx.run.root / "data" / "corpus.jsonl",
        out,
        shard=shard,
        encoder=str(ctx.run.root / "encoder"),
        max_len=ctx.config.encoder.max_doc_len,
        progress=ctx.progress,
    )
    return {"documents": count}


def _joined_embeddings(ctx: StageContext, doc_ids: list[str], doc_encoder):
    """(embeddings, summed encode seconds, shard count) of the index's finished shards under
    this config, checked against this run's corpus and encoder; None when there are none."""
    from retriever.encoders import params_sha256
    from retriever.index_shards import read_index_shards

    shards = finished_shards(ctx.run.root, "index", fingerprints(ctx.config)["index"])
    if not shards:
        return None
    ctx.log("index", f"joining {len(shards)} embedding shards")
    embeddings, joined_ids, first = read_index_shards(shards)
    same = (
        joined_ids == doc_ids
        and first["encoder_weights_sha256"] == params_sha256(doc_encoder.params)
        and first.get("max_len") == ctx.config.encoder.max_doc_len
    )
    if not same:
        raise ValueError(
            f"{shards[0].parent} holds shards of another corpus, encoder or token limit than "
            "this run's: remove it and run the shards again"
        )
    seconds = sum(json.loads((s / "shard.json").read_text())["seconds"] for s in shards)
    return embeddings, seconds, len(shards)


def index_stage(ctx: StageContext) -> dict:
    """Embeds the public corpus with the trained encoder (or joins the shards that did,
    `dpsynth.pipeline.stage_shards`) and builds the serving index, then measures its
    recall@k against exact search and its speed on the held-out queries."""
    from retriever.evaluate import load_towers
    from retriever.index import build_searcher
    from retriever.index_folder import corpus_digest, save_index_folder

    cfg = ctx.config.index
    doc_ids, texts = _corpus(ctx)
    encoder_dir = ctx.run.root / "encoder"
    query_encoder, doc_encoder = load_towers(str(encoder_dir))
    max_doc_len = ctx.config.encoder.max_doc_len
    joined = _joined_embeddings(ctx, doc_ids, doc_encoder)
    if joined is None:
        start = time.time()
        embeddings = doc_encoder.encode(texts, max_len=max_doc_len, progress=ctx.progress)
        encode_seconds, shard_count = time.time() - start, None
    else:
        embeddings, encode_seconds, shard_count = joined
    start = time.time()
    searcher = build_searcher(embeddings, kind=cfg.kind)
    build_seconds = time.time() - start
    save_index_folder(
        ctx.run.root / "index",
        searcher,
        encoder=str(encoder_dir.resolve()),
        doc_ids=doc_ids,
        digest=corpus_digest(doc_ids, texts),
    )
    # Recall of the index against the exact oracle, on the held-out query texts' embeddings
    # (a property of the index, not of the queries: no figure about a query is reported).
    queries = [r["query"] for r in read_jsonl(ctx.run.private / "data" / "test_queries.jsonl")]
    q = np.asarray(
        query_encoder.encode(queries, max_len=ctx.config.encoder.max_query_len), np.float32
    )
    k = min(cfg.k, len(doc_ids))
    start = time.time()
    _, found = searcher.search(q, k)
    search_seconds = time.time() - start
    exact = np.argsort(-(q @ embeddings.T), axis=1)[:, :k]
    recall = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found, exact)]))
    remove_shards(ctx.run.root, "index")
    return {
        **({"shards": shard_count} if shard_count else {}),
        "kind": searcher.kind,
        "documents": len(doc_ids),
        "dim": int(embeddings.shape[1]),
        f"recall_at_{k}_vs_exact": recall,
        "queries_per_second": len(queries) / max(search_seconds, 1e-9),
        "encode_seconds": encode_seconds,
        "build_seconds": build_seconds,
    }
