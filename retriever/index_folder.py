"""An index folder: a searcher over a corpus's embeddings, the encoder that made them and the
corpus's doc_ids.

Layout: ``index.json`` (``{"encoder": asset or folder, "doc_ids": [...], "kind": ...}``) and
``searcher/`` (a `retriever.index` searcher's ``save``). `retriever index build` writes it
(`build_index_folder`); `retriever index query` (`search_index_folder`), `retriever answer`
(`retriever.rag.loading`), `retriever serve` (`retriever.service.public_index`) and
`retriever index export` (`retriever.export.export_index`, through `index_embeddings`) read it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from retriever.index import Searcher

META_FILE = "index.json"
SEARCHER_DIR = "searcher"

# jax, flax and scann are imported inside the functions: the command line imports this module.


def save_index_folder(
    out: str | Path, searcher: Searcher, *, encoder: str, doc_ids: Sequence[str]
) -> None:
    """Writes `searcher` and its metadata to the folder `out` (created)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    searcher.save(out / SEARCHER_DIR)
    (out / META_FILE).write_text(
        json.dumps({"encoder": encoder, "doc_ids": list(doc_ids), "kind": searcher.kind})
    )


def build_index_folder(
    corpus: str | Path,
    out: str | Path,
    *,
    encoder: str = "all-minilm-l6-v2",
    kind: str = "auto",
    progress: bool = False,
) -> Searcher:
    """Embeds a corpus.jsonl with the document tower of `encoder` and saves an index of it.

    Args:
      corpus: corpus.jsonl (doc_id, text).
      out: the index folder (created).
      encoder: an encoder asset, folder or trained checkpoint (`retriever.evaluate.load_towers`).
      kind: the searcher kind (`retriever.index.build_searcher`).
      progress: show a progress bar while embedding.

    Returns:
      The searcher, as saved.
    """
    from retriever.data import read_corpus
    from retriever.evaluate import load_towers
    from retriever.index import build_searcher

    doc_ids, texts = read_corpus(corpus)
    _, doc_encoder = load_towers(encoder)
    embeddings = doc_encoder.encode(texts, progress=progress)
    searcher = build_searcher(embeddings, kind=kind)
    save_index_folder(out, searcher, encoder=encoder, doc_ids=doc_ids)
    return searcher


def read_index_meta(index: str | Path) -> dict[str, Any]:
    """The ``index.json`` of an index folder.

    Raises:
      FileNotFoundError: the folder holds no ``index.json``.
    """
    meta_path = Path(index) / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"no index in {index} (missing {META_FILE})")
    return json.loads(meta_path.read_text())


# Float32 corpus rows in corpus order, as each searcher kind saves them: the exact searcher's
# own file, and ScaNN's dataset (kept for brute-force scoring and for reordering).
_EMBEDDING_FILES = {"exact": "embeddings.npy", "scann-bf": "dataset.npy", "scann": "dataset.npy"}


def index_embeddings(index: str | Path) -> np.ndarray:
    """The corpus embeddings float32 [n, dim] an index folder's searcher keeps, in doc_id order.

    Raises:
      FileNotFoundError: no index in `index`.
      ValueError: the searcher keeps no float embeddings of the saved size.
    """
    import numpy as np

    from retriever.index import META_FILE as SEARCHER_META

    folder = Path(index) / SEARCHER_DIR
    meta_path = folder / SEARCHER_META
    if not meta_path.is_file():
        raise FileNotFoundError(f"no searcher in {index} (missing {SEARCHER_DIR}/{SEARCHER_META})")
    meta = json.loads(meta_path.read_text())
    path = folder / _EMBEDDING_FILES.get(meta.get("kind"), "embeddings.npy")
    embeddings = np.load(path) if path.is_file() else None
    shape = (meta.get("size"), meta.get("dim"))
    if embeddings is None or embeddings.shape != shape or embeddings.dtype != np.float32:
        raise ValueError(
            f"the {meta.get('kind')} searcher in {index} keeps no float32 embeddings of shape "
            f"{shape}: rebuild the index with `retriever index build`"
        )
    return embeddings


def load_index_searcher(index: str | Path) -> Searcher:
    """The searcher saved in an index folder."""
    from retriever.index import load_searcher

    return load_searcher(Path(index) / SEARCHER_DIR)


def search_index_folder(
    index: str | Path, queries: Sequence[str], k: int
) -> list[list[dict[str, Any]]]:
    """The top-`k` documents of each query, best first: ``{"doc_id", "score"}`` per hit.

    The queries are embedded with the query tower of the encoder the index was built with.
    """
    from retriever.evaluate import load_towers

    meta = read_index_meta(index)
    query_encoder, _ = load_towers(meta["encoder"])
    searcher = load_index_searcher(index)
    scores, found = searcher.search(query_encoder.encode(list(queries)), k)
    return [
        [{"doc_id": meta["doc_ids"][i], "score": float(s)} for s, i in zip(srow, irow) if i >= 0]
        for srow, irow in zip(scores, found)
    ]
