"""An index built in shards: each shard embeds its run of the corpus's batches; a merge builds it.

`retriever index build --shard I/N` writes a shard folder (``shard.json``, ``rows.npy``,
``embeddings.npy``) instead of an index; `retriever index merge` checks that its folders are
the N shards of one build (same corpus, encoder and count) and writes the index folder. The
shards' batches are the unsharded `TextEncoder.encode`'s (`TextEncoder.encode_shard`), so the
merged index equals the unsharded build's, file for file (tested), when the shards ran on the
same JAX version and device kind (checked). The encoder is matched by its reference, its
provenance and a hash of its document tower's weights (a folder retrained between two
shards is refused).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from retriever.index_folder import (
    check_kind,
    corpus_digest,
    encoder_reference,
    save_index_folder,
)
from synthgen import shards
from synthgen.corpora import file_sha256
from synthgen.shards import Shard

SHARD_FILE = "shard.json"


def encode_index_shard(
    corpus: str | Path,
    out: str | Path,
    *,
    shard: Shard,
    encoder: str = "all-minilm-l6-v2",
    max_len: int = 128,
    progress: bool = False,
) -> int:
    """Embeds shard `shard` of `corpus` with `encoder`'s document tower into the folder `out`.

    `max_len` is the documents' token limit (`TextEncoder.encode`'s): the shards of one build
    must share it (checked by the merge).

    Returns:
      The number of documents this shard embedded.
    """
    from retriever import provenance as prov
    from retriever.data import read_corpus
    from retriever.encoders import params_sha256
    from retriever.evaluate import load_towers

    _, doc_encoder = load_towers(encoder)
    doc_ids, texts = read_corpus(corpus)
    started = time.time()
    rows, embeddings = doc_encoder.encode_shard(texts, shard, max_len=max_len, progress=progress)
    seconds = time.time() - started
    reference = encoder_reference(encoder)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "rows.npy", rows)
    np.save(out / "embeddings.npy", embeddings)
    record = {
        "index": shard.index,
        "count": shard.count,
        "corpus_sha256": file_sha256(corpus),
        "corpus_digest": corpus_digest(doc_ids, texts),
        "num_documents": len(doc_ids),
        "encoder": reference,
        "encoder_provenance": prov.encoder_provenance(reference),
        "encoder_weights_sha256": params_sha256(doc_encoder.params),
        "max_len": max_len,
        "seconds": seconds,
        "doc_ids": [doc_ids[r] for r in rows],
        "platform": shards.platform(),
        "files": {f: file_sha256(out / f) for f in ("rows.npy", "embeddings.npy")},
    }
    (out / SHARD_FILE).write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    return len(rows)


def read_index_shards(shard_dirs: Sequence[str | Path]) -> tuple[np.ndarray, list[str], dict]:
    """The N shard folders of one build, checked and joined: (embeddings in corpus order,
    doc_ids, the first shard's record).

    Raises:
      ValueError: a folder that is not a shard, shards of different builds, a missing or
        repeated shard, rows not covering the corpus exactly once.
    """
    found = []
    for folder in map(Path, shard_dirs):
        path = folder / SHARD_FILE
        if not path.is_file():
            raise ValueError(f"{folder} is not an index shard (no {SHARD_FILE})")
        found.append((json.loads(path.read_text(encoding="utf-8")), folder))
    if not found:
        raise ValueError("no shard folders given")
    found.sort(key=lambda s: s[0]["index"])
    count = found[0][0]["count"]
    if [s[0]["index"] for s in found] != list(range(count)):
        raise ValueError(
            f"need shards 0..{count - 1} once each, got {[s[0]['index'] for s in found]}"
        )
    keys = (
        "count",
        "corpus_sha256",
        "corpus_digest",
        "num_documents",
        "encoder",
        "encoder_provenance",
        "encoder_weights_sha256",
        "max_len",
        "platform",
    )
    first = found[0][0]
    n = first["num_documents"]
    embeddings = None
    doc_ids: list[str | None] = [None] * n
    for record, folder in found:
        if any(record.get(k) != first.get(k) for k in keys):
            raise ValueError(
                f"{folder} is a shard of another build (corpus, encoder or its weights, token "
                "limit, count or platform)"
            )
        for name, digest in record["files"].items():
            if file_sha256(folder / name) != digest:
                raise ValueError(f"{folder}/{name} is not the file its shard wrote")
        rows = np.load(folder / "rows.npy")
        part = np.load(folder / "embeddings.npy")
        if embeddings is None:
            embeddings = np.zeros((n, part.shape[1]), np.float32)
        embeddings[rows] = part
        for row, doc_id in zip(rows.tolist(), record["doc_ids"], strict=True):
            if doc_ids[row] is not None:
                raise ValueError(f"{folder} repeats document {doc_id!r}")
            doc_ids[row] = doc_id
    if any(d is None for d in doc_ids):
        raise ValueError(f"the shards cover {sum(d is not None for d in doc_ids)} of {n} documents")
    return embeddings, doc_ids, first


def merge_index_shards(shard_dirs: Sequence[str | Path], out: str | Path, *, kind: str = "auto"):
    """Joins the N shard folders of one build into an index folder; returns its searcher.

    Raises:
      ValueError: as `read_index_shards`; an unknown `kind`.
    """
    from retriever.index import build_searcher

    check_kind(kind)
    embeddings, doc_ids, first = read_index_shards(shard_dirs)
    searcher = build_searcher(embeddings, kind=kind)
    save_index_folder(
        out,
        searcher,
        encoder=first["encoder"],
        doc_ids=doc_ids,
        provenance=first["encoder_provenance"],
        digest=first.get("corpus_digest"),  # none: shards of an older version
    )
    return searcher
