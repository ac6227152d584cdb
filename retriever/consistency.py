"""Round-trip consistency filtering of synthetic queries (Promptagator, Dai et al. 2022).

A synthetic (document, query) pair is kept when a public retriever, searching the public
corpus with the query, ranks the query's own document within its top k; empty queries and
repeated pairs go first. The filtered folder has the generator's layout, so `retriever
train` reads it as it reads the unfiltered one; its metadata keeps the release's guarantee
and states the filter. See docs/guides/retriever.md.

Privacy:
  Post-processing of a DP release with public data only (Dwork and Roth 2014, Prop. 2.1):
  the queries are the DP generator's output, the corpus is public, and the filter's encoder
  must be a public pretrained model (checked from its provenance). An encoder trained on
  private data would make the choice of kept queries depend on that data, and is refused.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

FILTER_KIND = "round-trip consistency (Dai et al. 2022)"
SCORE_BLOCK = 1 << 24  # query-document scores computed at a time (64 MB of float32)


@dataclasses.dataclass(frozen=True)
class ConsistencyFilter:
    """Keep a query when `encoder` ranks its own document within the top `k` of the corpus.

    Args:
      k: rank cut-off (1 = the query's document must come first; ties with another
        document count in the query's favour).
      encoder: a public pretrained encoder (asset name, ``random:...`` or a folder whose
        provenance says pretrained).
      max_query_len, max_doc_len: token limits of the encoder's inputs.
      dedupe: drop repeats of a (doc_id, query) pair after the first, and empty queries.
    """

    k: int = 10
    encoder: str = "all-minilm-l6-v2"
    max_query_len: int = 32
    max_doc_len: int = 128
    dedupe: bool = True

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k=}")
        if self.max_query_len < 1 or self.max_doc_len < 1:
            raise ValueError("max_query_len and max_doc_len must be >= 1")


def check_public_encoder(encoder: str) -> None:
    """Refuses an encoder not recorded as a public pretrained model (see the module's
    Privacy note).

    Raises:
      ValueError: the encoder was trained (on anything) or its origin is not recorded.
    """
    from retriever.provenance import encoder_provenance, read_provenance

    path = Path(encoder).expanduser()
    recorded = read_provenance(path) if path.is_dir() else None
    known = not path.is_dir() or recorded is not None
    if not known or encoder_provenance(encoder)["trained_on"]["kind"] != "pretrained":
        raise ValueError(
            f"the consistency filter's encoder must be a public pretrained model, and "
            f"{encoder!r} is trained or of unrecorded origin: its choice of kept queries "
            "could depend on private data"
        )


def source_ranks(query_emb: np.ndarray, doc_emb: np.ndarray, sources: np.ndarray) -> np.ndarray:
    """1-based rank of each query's source document under inner-product search (exact).

    Args:
      query_emb: [m, dim] query embeddings.
      doc_emb: [n, dim] document embeddings.
      sources: [m] row of each query's document in `doc_emb`.

    Returns:
      [m] int64: 1 + the number of documents scoring strictly higher than the source (a tie
      does not push the source down).
    """
    query_emb = np.asarray(query_emb, np.float32)
    doc_emb = np.asarray(doc_emb, np.float32)
    sources = np.asarray(sources, np.int64)
    ranks = np.empty(len(sources), np.int64)
    chunk = max(1, SCORE_BLOCK // max(len(doc_emb), 1))
    for start in range(0, len(sources), chunk):
        scores = query_emb[start : start + chunk] @ doc_emb.T
        own = scores[np.arange(len(scores)), sources[start : start + chunk]]
        ranks[start : start + chunk] = 1 + np.sum(scores > own[:, None], axis=1)
    return ranks


def dedupe_pairs(rows: Sequence[dict]) -> list[dict]:
    """`rows` without empty queries and without repeats of a (doc_id, stripped query) pair
    (the first kept), in their given order."""
    kept, seen = [], set()
    for row in rows:
        key = (str(row["doc_id"]), str(row["query"]).strip())
        if key[1] and key not in seen:
            seen.add(key)
            kept.append(row)
    return kept


def filter_pairs(
    rows: Sequence[dict],
    doc_ids: Sequence[str],
    texts: Sequence[str],
    config: ConsistencyFilter,
    *,
    progress: bool = False,
) -> tuple[list[dict], dict]:
    """The rows (``doc_id``, ``query``, ...) whose query ranks its document within the top k.

    Args:
      rows: synthetic pairs; each ``doc_id`` must be in `doc_ids`.
      doc_ids, texts: the public corpus searched.
      config: the filter.
      progress: show progress bars while encoding.

    Returns:
      (kept rows in their given order, the filter's public record for the metadata).

    Raises:
      ValueError: a row's doc_id is not in the corpus; an encoder that is not public.
    """
    from retriever.evaluate import encoder_label, load_towers

    check_public_encoder(config.encoder)
    position = {str(d): i for i, d in enumerate(doc_ids)}
    missing = sorted({str(r["doc_id"]) for r in rows} - set(position))
    if missing:
        raise ValueError(f"{len(missing)} synthetic rows name documents not in the corpus")
    candidates = dedupe_pairs(rows) if config.dedupe else list(rows)
    ranks = np.zeros(0, np.int64)
    if candidates:
        query_encoder, doc_encoder = load_towers(config.encoder)
        doc_emb = doc_encoder.encode(texts, max_len=config.max_doc_len, progress=progress)
        query_emb = query_encoder.encode(
            [str(r["query"]) for r in candidates], max_len=config.max_query_len, progress=progress
        )
        sources = np.array([position[str(r["doc_id"])] for r in candidates], np.int64)
        ranks = source_ranks(query_emb, doc_emb, sources)
    kept = [row for row, rank in zip(candidates, ranks, strict=True) if rank <= config.k]
    record = {
        "kind": FILTER_KIND,
        "encoder": encoder_label(config.encoder),
        "k": config.k,
        "dedupe": config.dedupe,
        "max_query_len": config.max_query_len,
        "max_doc_len": config.max_doc_len,
        "corpus_documents": len(doc_ids),
        "queries_in": len(rows),
        "dropped_empty_or_repeated": len(rows) - len(candidates),
        "kept": len(kept),
        "statement": "post-processing of the DP release with public data (the corpus and a "
        "public pretrained encoder): no privacy budget spent, the release's guarantee holds",
    }
    return kept, record


def filter_query_folder(
    queries_dir: str | Path,
    corpus: str | Path,
    out_dir: str | Path,
    config: ConsistencyFilter,
    *,
    progress: bool = False,
) -> dict:
    """Filters a generator's output folder (`synthgen generate-queries`) into `out_dir`.

    The corpus (corpus.jsonl: doc_id, text) is what the filter searches: the public
    documents, of which the synthetic queries' documents are a part.

    Returns:
      The filter's record, as written to ``out_dir/metadata.json`` under ``"filter"``.
    """
    from retriever.data import read_corpus
    from synthgen.corpora import file_sha256, read_jsonl
    from synthgen.querygen import write_query_folder

    source = Path(queries_dir)
    metadata = json.loads((source / "metadata.json").read_text())
    if "filter" in metadata:
        raise ValueError(f"{source} is already filtered: filter the generator's own output")
    if Path(out_dir).resolve() == source.resolve():
        raise ValueError("--out must be a new folder: the release is not overwritten")
    recorded = (metadata.get("files") or {}).get("queries.jsonl")
    if recorded != file_sha256(source / "queries.jsonl"):
        # An edited file is not the DP release: its rows may hold anything, so the filtered
        # folder must not carry the release's guarantee (as `provenance.for_pairs_file`).
        raise ValueError(
            f"{source}/queries.jsonl is not the file its generator wrote (SHA-256 differs from "
            "metadata.json): only an unedited release keeps its guarantee"
        )
    rows = read_jsonl(source / "queries.jsonl")
    doc_ids, texts = read_corpus(corpus)
    kept, record = filter_pairs(rows, doc_ids, texts, config, progress=progress)
    record["corpus_sha256"] = file_sha256(corpus)
    record["source_files"] = metadata.get("files")
    columns = {name: [r[name] for r in kept] for name in ("doc_id", "document", "query")}
    out_meta = {k: v for k, v in metadata.items() if k not in ("num_documents", "files")}
    out_meta["filter"] = record
    write_query_folder(Path(out_dir), columns, out_meta, len({r["doc_id"] for r in kept}))
    return record
