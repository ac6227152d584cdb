"""An index folder: a searcher over a corpus's embeddings, the encoder that made them and the
corpus's doc_ids.

Layout: ``index.json`` and ``searcher/`` (a `retriever.index` searcher's ``save``).
`retriever index build` writes it (`build_index_folder`); `retriever index query`
(`search_index_folder`), `retriever answer` (`retriever.rag.loading`), `retriever serve`
(`dpsynth.service.public_index`) and `retriever index export` (`retriever.export.export_index`)
read it, each through `index_encoder`.

``index.json`` (format 2) holds ``format``, ``encoder`` (an absolute, resolved folder or an
asset name, so the index works from any working directory), ``encoder_provenance`` (a copy
of the encoder's provenance at build time: what an export states, and what a reader checks
the folder against before embedding queries), ``doc_ids``, ``kind`` and ``corpus_digest``
(`corpus_digest`: which corpus the index embeds, checked by `retriever serve`'s public
index; absent from indexes written before it). Format 1 (no provenance) still loads, with a
one-line warning (`index_encoder`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from retriever.index import Searcher

META_FILE = "index.json"
SEARCHER_DIR = "searcher"
FORMAT = 2  # of index.json; 1 (no "format" field): the encoder as typed, no provenance copy
ENCODER_OPTION = "--encoder"

# jax, flax and scann are imported inside the functions: the command line imports this module.


def encoder_reference(encoder: str | Path) -> str:
    """How ``index.json`` names an encoder: its absolute, resolved folder if there is one at
    that path (as `retriever.encoders.load_encoder` looks there first), else the name as given
    (an asset, ``random:...``)."""
    path = Path(encoder).expanduser()
    return str(path.resolve()) if path.exists() else str(encoder)


def corpus_digest(doc_ids: Sequence[str], texts: Sequence[str]) -> str:
    """SHA-256 of a corpus's (doc_id, text) rows in order: two corpora that share doc_ids but
    not texts (a redacted copy) differ."""
    import hashlib

    digest = hashlib.sha256()
    for doc_id, text in zip(doc_ids, texts, strict=True):
        digest.update(json.dumps([str(doc_id), text], ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()


def save_index_folder(
    out: str | Path,
    searcher: Searcher,
    *,
    encoder: str,
    doc_ids: Sequence[str],
    provenance: dict | None = None,
    digest: str | None = None,
) -> None:
    """Writes `searcher` and its metadata (format 2) to the folder `out` (created).

    Args:
      out: the index folder.
      searcher: the searcher over the corpus's embeddings.
      encoder: the encoder that made them (asset or folder; a folder is recorded by its
        absolute path, `encoder_reference`).
      doc_ids: the corpus's doc_ids, in embedding order.
      provenance: the encoder's provenance (default: `encoder_provenance` of `encoder`, read
        now); ``index.json`` keeps a copy.
      digest: the corpus's `corpus_digest`, recorded in ``index.json`` (None: not recorded).
    """
    from retriever import provenance as prov

    reference = encoder_reference(encoder)
    record = prov.encoder_provenance(reference) if provenance is None else provenance
    meta = {
        "format": FORMAT,
        "encoder": reference,
        "encoder_provenance": record,
        "doc_ids": list(doc_ids),
        "kind": searcher.kind,
    }
    if digest is not None:
        meta["corpus_digest"] = digest
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    searcher.save(out / SEARCHER_DIR)
    (out / META_FILE).write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")


def check_kind(kind: str) -> None:
    """Refuses a searcher kind `retriever.index.build_searcher` does not know.

    Raises:
      ValueError: unknown kind.
    """
    from retriever.index import KINDS

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind=}")


def build_index_folder(
    corpus: str | Path,
    out: str | Path,
    *,
    encoder: str = "all-minilm-l6-v2",
    kind: str = "auto",
    progress: bool = False,
) -> Searcher:
    """Embeds a corpus.jsonl with the document tower of `encoder` and saves an index of it.

    The options are checked before the corpus is read or embedded: an unknown `kind` and an
    encoder that does not load fail first.

    Args:
      corpus: corpus.jsonl (doc_id, text).
      out: the index folder (created).
      encoder: an encoder asset, folder or trained checkpoint (`retriever.evaluate.load_towers`).
      kind: the searcher kind (`retriever.index.build_searcher`).
      progress: show a progress bar while embedding.

    Returns:
      The searcher, as saved.

    Raises:
      ValueError: unknown `kind`.
      FileNotFoundError: no such encoder or corpus.
    """
    from retriever.data import read_corpus
    from retriever.evaluate import load_towers
    from retriever.index import build_searcher

    check_kind(kind)
    _, doc_encoder = load_towers(encoder)
    doc_ids, texts = read_corpus(corpus)
    embeddings = doc_encoder.encode(texts, progress=progress)
    searcher = build_searcher(embeddings, kind=kind)
    digest = corpus_digest(doc_ids, texts)
    save_index_folder(out, searcher, encoder=encoder, doc_ids=doc_ids, digest=digest)
    return searcher


def read_index_meta(index: str | Path) -> dict[str, Any]:
    """The ``index.json`` of an index folder, as stored (format 1 or 2).

    Raises:
      FileNotFoundError: the folder holds no ``index.json``.
      ValueError: a format newer than this dpsynth reads.
    """
    meta_path = Path(index) / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"no index in {index} (missing {META_FILE})")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("format", 1) > FORMAT:
        raise ValueError(
            f"{meta_path} is of format {meta['format']}, newer than this dpsynth reads "
            f"({FORMAT}): upgrade dpsynth"
        )
    return meta


def index_encoder(
    index: str | Path,
    *,
    encoder: str | Path | None = None,
    meta: dict[str, Any] | None = None,
    load: bool = True,
    option: str | None = ENCODER_OPTION,
) -> tuple[str, dict]:
    """The encoder of an index folder, checked against its ``index.json``, and its provenance.

    Format 2: with `encoder` given (the folder moved), its provenance must equal the
    recorded copy; else, when `load`, the recorded folder must still be there with that
    provenance (with `load` False, as for an export, it is not looked at). The provenance
    returned is always the copy: it describes the encoder that made the embeddings. A moved
    plain Hugging Face folder matches nothing (its provenance names its path): rebuild.
    Format 1 (no provenance): `encoder`, else the recorded path resolved against the working
    directory, then against the index's parent; its own provenance, and one warning line.

    Args:
      index: the index folder.
      encoder: the encoder to use instead of the recorded one (asset or folder).
      meta: its ``index.json`` if already read (`read_index_meta`).
      load: the caller will load the encoder (query, answer, serve), so it must be there.
      option: the caller's option that names an encoder, for the messages (None: none).

    Returns:
      (what to load: an absolute folder or an asset name, the provenance to state).

    Raises:
      FileNotFoundError: no index; the recorded encoder folder is not there (format 2) or
        not found (format 1).
      ValueError: the encoder's provenance differs from the recorded copy.
    """
    from retriever import provenance as prov

    meta = read_index_meta(index) if meta is None else meta
    stored = str(meta["encoder"])
    recorded = meta.get("encoder_provenance")
    fix = f"pass its new path as {option} PATH, or " if option else ""
    rebuild = "rebuild the index with `retriever index build --encoder PATH`"
    if recorded is None:
        return _format_1_encoder(index, stored, encoder, fix, rebuild)
    if encoder is None and not load:
        return stored, recorded
    given = encoder is not None
    reference = encoder_reference(encoder) if given else stored
    if not given and Path(stored).is_absolute() and not Path(stored).is_dir():
        raise FileNotFoundError(
            f"index {index} was built with the encoder folder {stored}, which is not there "
            f"(moved or deleted): {fix}{rebuild}"
        )
    found = json.loads(json.dumps(prov.encoder_provenance(reference), ensure_ascii=False))
    if found != recorded:
        keys = sorted(k for k in set(found) | set(recorded) if found.get(k) != recorded.get(k))
        which = f"the encoder {reference}" if given else f"the encoder folder {reference}"
        raise ValueError(
            f"{which} is not the one index {index} was built with: its provenance differs "
            f"from the copy in {META_FILE} (in {', '.join(keys)}; found: "
            f"{found.get('statement')!r}; recorded: {recorded.get('statement')!r}): "
            f"{'pass the encoder the index was built with, or ' if given else fix}{rebuild}"
        )
    return reference, recorded


def _format_1_encoder(
    index: str | Path, stored: str, encoder: str | Path | None, fix: str, rebuild: str
) -> tuple[str, dict]:
    """`index_encoder` of a format 1 ``index.json`` (see there)."""
    from retriever import provenance as prov
    from retriever.encoders import RANDOM_PREFIX
    from synthgen import assets

    if encoder is not None:
        reference = encoder_reference(encoder)
    else:
        typed = Path(stored).expanduser()
        candidates = (
            [typed] if typed.is_absolute() else [typed, Path(index).resolve().parent / typed]
        )
        there = [c for c in candidates if c.exists()]
        if there:
            reference = str(there[0].resolve())
        elif stored.startswith(RANDOM_PREFIX) or stored in assets.REGISTRY:
            reference = stored
        else:
            where = " nor in ".join(str(c.parent.resolve()) for c in candidates)
            raise FileNotFoundError(
                f"index {index} was built with the encoder {stored!r} (recorded as typed, in "
                f"an {META_FILE} of format 1), which is not in {where}: {fix}{rebuild}"
            )
    print(
        f"warning: {Path(index) / META_FILE} is of format 1 (no absolute encoder path, no copy "
        f"of its provenance): using the encoder {reference}; {rebuild} to record them",
        file=sys.stderr,
    )
    return reference, prov.encoder_provenance(reference)


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
    index: str | Path,
    queries: Sequence[str],
    k: int,
    *,
    encoder: str | Path | None = None,
) -> list[list[dict[str, Any]]]:
    """The top-`k` documents of each query, best first: ``{"doc_id", "score"}`` per hit.

    The queries are embedded with the query tower of the encoder the index was built with
    (`index_encoder`: the recorded folder, or `encoder` where it moved, checked against the
    provenance the index recorded).

    Raises:
      FileNotFoundError: no index, or its encoder folder is not there.
      ValueError: the encoder is not the one the index was built with.
    """
    from retriever.evaluate import load_towers

    meta = read_index_meta(index)
    reference, _ = index_encoder(index, encoder=encoder, meta=meta)
    query_encoder, _ = load_towers(reference)
    searcher = load_index_searcher(index)
    scores, found = searcher.search(query_encoder.encode(list(queries)), k)
    return [
        [{"doc_id": meta["doc_ids"][i], "score": float(s)} for s, i in zip(srow, irow) if i >= 0]
        for srow, irow in zip(scores, found)
    ]
