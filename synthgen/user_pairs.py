"""A user's own (document, query) pairs, checked line by line before anything is charged.

`read_pairs` reads a JSONL of (query, clicked document) pairs, each with the document's
text or its id in a public JSONL collection. Every problem is one line naming the file and
line, never its content: a line that is not JSON or lacks a field, an empty field, an
unknown or repeated document id, too few distinct documents for a split.
`split_collection` then holds out whole documents of the collection. See
docs/guides/pipeline.md.

Privacy:
  Unit: one pair (add/remove-one), as in the rest of the main job; the documents are public.
  Nothing here is released; the checks' errors name lines and counts, never content.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

MIN_DOCUMENTS = 10  # distinct documents the pairs must name (a held-out share needs some)


class PairsFileError(ValueError):
    """A pairs or documents file the main job cannot use; the message names the line."""


@dataclasses.dataclass(frozen=True)
class PairsSource:
    """Where a user's pairs are and which fields hold what (public settings).

    Attributes:
      pairs: JSONL of pairs, one object per line.
      documents: JSONL collection of public documents (None: the pairs hold the text).
      query_field: the pairs' query field.
      document_field: the pairs' document text field (pairs without `documents`).
      doc_id_field: the pairs' document id field (optional in pairs that hold the text:
        without it, identical texts are one document).
      text_field: the collection's text field.
      id_field: the collection's id field (None: `doc_id_field`).
      title_field: the collection's optional title field.
    """

    pairs: str
    documents: str | None = None
    query_field: str = "query"
    document_field: str = "document"
    doc_id_field: str = "doc_id"
    text_field: str = "text"
    title_field: str = "title"
    id_field: str | None = None


def json_objects(path: Path, error: type[ValueError] = ValueError) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank line of a UTF-8 JSONL file; `error`, naming
    the line and never its content, on one that is not a JSON object."""
    for number, line in enumerate(Path(path).read_bytes().splitlines(), start=1):
        if not line.strip():  # bytes split at \n, \r\n and \r, as text mode reads lines
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise error(f"{path}:{number}: not UTF-8") from None
        except json.JSONDecodeError:
            raise error(f"{path}:{number}: not valid JSON") from None
        if not isinstance(row, dict):
            raise error(f"{path}:{number}: not a JSON object")
        yield number, row


def _lines(path: Path):
    """`json_objects` of a pairs or documents file; PairsFileError on a bad line."""
    if not path.is_file():
        raise PairsFileError(f"{path}: no such file")
    return json_objects(path, PairsFileError)


def _text(path: Path, number: int, row: dict, field: str) -> str:
    if field not in row:
        raise PairsFileError(f"{path}:{number}: no {field!r} field")
    value = row[field]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise PairsFileError(f"{path}:{number}: {field!r} field is not a string or an integer")
    if not str(value).strip():
        raise PairsFileError(f"{path}:{number}: empty {field!r} field")
    return str(value).strip()


def read_documents(source: PairsSource) -> dict[str, dict]:
    """The collection: doc_id -> {"doc_id", "title", "text"} (file order)."""
    path = Path(source.documents)
    collection: dict[str, dict] = {}
    first: dict[str, int] = {}
    for number, row in _lines(path):
        doc_id = _text(path, number, row, source.id_field or source.doc_id_field)
        if doc_id in collection:
            raise PairsFileError(
                f"{path}:{number}: document id repeated (first on line {first[doc_id]})"
            )
        title = row.get(source.title_field)
        text = _text(path, number, row, source.text_field)
        collection[doc_id] = {"doc_id": doc_id, "title": str(title or ""), "text": text}
        first[doc_id] = number
    if not collection:
        raise PairsFileError(f"{path}: holds no documents")
    return collection


def read_pairs(source: PairsSource) -> tuple[list[dict], list[dict]]:
    """(collection, pairs): the documents {"doc_id", "title", "text"} and the pairs
    {"doc_id", "document", "query"} (file order).

    Raises:
      PairsFileError: the first problem found, naming its file and line (module docstring).
    """
    path = Path(source.pairs)
    collection = read_documents(source) if source.documents else {}
    by_text: dict[str, str] = {}
    pairs: list[dict] = []
    for number, row in _lines(path):
        query = _text(path, number, row, source.query_field)
        if source.documents:
            doc_id = _text(path, number, row, source.doc_id_field)
            if doc_id not in collection:
                raise PairsFileError(
                    f"{path}:{number}: document id not in {source.documents} "
                    f"(field {source.doc_id_field!r})"
                )
            document = collection[doc_id]["text"]
        else:
            if source.document_field not in row and source.doc_id_field in row:
                raise PairsFileError(
                    f"{path}:{number}: no {source.document_field!r} field; pairs that name "
                    "documents by id need the collection (--documents FILE)"
                )
            document = _text(path, number, row, source.document_field)
            if source.doc_id_field in row:
                doc_id = _text(path, number, row, source.doc_id_field)
                known = collection.get(doc_id)
                if known is not None and known["text"] != document:
                    raise PairsFileError(f"{path}:{number}: document id used for another text")
            else:  # identical texts are one document; the id is a digest of the text
                doc_id = by_text.setdefault(
                    document, "doc-" + hashlib.sha256(document.encode()).hexdigest()[:12]
                )
            collection.setdefault(doc_id, {"doc_id": doc_id, "title": "", "text": document})
        pairs.append({"doc_id": doc_id, "document": document, "query": query})
    if not pairs:
        raise PairsFileError(f"{path}: holds no pairs")
    named = len({p["doc_id"] for p in pairs})
    if named < MIN_DOCUMENTS:
        raise PairsFileError(
            f"{path}: the pairs name {named} distinct documents, fewer than {MIN_DOCUMENTS} "
            "(documents are held out whole for the evaluation)"
        )
    return list(collection.values()), pairs


def split_collection(
    collection: list[dict], pairs: list[dict], *, test_fraction: float, seed: int
) -> tuple[list[dict], list[dict], list[dict]]:
    """(train pairs, held-out pairs, target documents): whole documents of the public
    collection held out by a seeded permutation of its ids (never of the pairs), with their
    pairs; the targets are the collection's other documents (which documents have pairs,
    and how many, is private and decides nothing here)."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction=}")
    ids = [d["doc_id"] for d in collection]
    order = np.random.default_rng(seed).permutation(len(ids))
    held = {ids[i] for i in order[: max(1, int(round(test_fraction * len(ids))))]}
    train = [p for p in pairs if p["doc_id"] not in held]
    test = [p for p in pairs if p["doc_id"] in held]
    targets = [
        {"doc_id": d["doc_id"], "document": d["text"]}
        for d in collection
        if d["doc_id"] not in held
    ]
    return train, test, targets
