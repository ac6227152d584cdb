"""Corpus loaders: real text from the offline assets (or a local path) as `datasets.Dataset`.

`load_wiki_summaries` (Wikipedia lead paragraphs, query = the short description),
`load_chatterbot` (question/answer pairs), `load_jsonl` (users' own corpora) and
`split_by_document` (the fixed train/test split by document that every stage shares).
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import numpy as np
import yaml

from synthgen import assets
from synthgen.assets import file_sha256 as file_sha256  # re-exported
from synthgen.user_pairs import json_objects

WIKI_FILE = "summaries_en-us.json"


def _resolve_file(name_or_path: str | Path, filename: str) -> Path:
    path = assets.resolve(name_or_path)
    if path.is_dir():
        candidates = sorted(path.rglob(filename))
        if not candidates:
            raise FileNotFoundError(f"no {filename} under {path}")
        path = candidates[0]
    return path


def load_wiki_summaries(
    name_or_path: str | Path = "wiki-summaries-en", *, limit: int | None = None
) -> datasets.Dataset:
    """Loads the wiki summaries corpus.

    Entries without a description or paragraph are dropped; doc_ids number the entries in
    file order, before dropping, so they are stable across runs.

    Args:
      name_or_path: asset name, the JSON file, or a folder containing it.
      limit: keep only the first `limit` usable entries.

    Returns:
      Dataset with string columns doc_id, title, document, query, topic.
    """
    path = _resolve_file(name_or_path, WIKI_FILE)
    raw = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError(f"{path} is not a wiki summaries file (expected a JSON object)")
    rows: dict[str, list[str]] = {k: [] for k in ("doc_id", "title", "document", "query", "topic")}
    for index, (key, entry) in enumerate(raw.items()):
        document = (entry.get("extract") or "").strip()
        query = (entry.get("description") or "").strip()
        if not document or not query:
            continue
        rows["doc_id"].append(f"wiki-{index:05d}")
        rows["title"].append(entry.get("title") or key)
        rows["document"].append(document)
        rows["query"].append(query)
        rows["topic"].append(entry.get("topic") or "Uncategorized")
        if limit is not None and len(rows["doc_id"]) >= limit:
            break
    return datasets.Dataset.from_dict(rows)


SPLITS = ("all", "train", "test")


def split_by_document(
    ds: datasets.Dataset, *, test_fraction: float = 0.2, seed: int = 0
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Splits rows (one per document) into train and test with a fixed, public seed.

    The same (fraction, seed) gives the same split in `synthgen` (generator training on the
    train pairs) and `retriever` (evaluation on the test pairs), so no test query is ever
    seen by a generator. Row order is kept within each part.

    Raises:
      ValueError: `test_fraction` outside (0, 1).
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction=}")
    order = np.random.default_rng(seed).permutation(len(ds))
    is_test = np.zeros(len(ds), bool)
    is_test[order[: max(1, int(round(test_fraction * len(ds))))]] = True
    return ds.select(np.flatnonzero(~is_test)), ds.select(np.flatnonzero(is_test))


def select_split(ds: datasets.Dataset, split: str, **kwargs) -> datasets.Dataset:
    """`ds` itself for "all", else that part of `split_by_document(ds, **kwargs)`."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split=}")
    if split == "all":
        return ds
    train, test = split_by_document(ds, **kwargs)
    return train if split == "train" else test


def load_chatterbot(name_or_path: str | Path = "chatterbot-corpus-en") -> datasets.Dataset:
    """Loads ChatterBot YAML conversations as single-turn pairs.

    Args:
      name_or_path: asset name, a folder of YAML files, or one YAML file.

    Returns:
      Dataset with string columns category, question, answer (first two turns of each
      conversation; files are read in sorted order).
    """
    path = assets.resolve(name_or_path)
    files = sorted(path.rglob("*.yml")) if path.is_dir() else [path]
    rows: dict[str, list[str]] = {"category": [], "question": [], "answer": []}
    for file in files:
        data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
        category = file.stem
        for conversation in data.get("conversations", []):
            if len(conversation) < 2:
                continue
            question, answer = (str(turn).strip() for turn in conversation[:2])
            if question and answer:
                rows["category"].append(category)
                rows["question"].append(question)
                rows["answer"].append(answer)
    if not rows["question"]:
        raise ValueError(f"no conversations found in {path}")
    return datasets.Dataset.from_dict(rows)


def read_jsonl(path: str | Path, *, required: tuple[str, ...] = ()) -> list[dict]:
    """The records of a JSON-lines file (blank lines skipped), each checked for `required`.

    Raises:
      FileNotFoundError: the file does not exist.
      ValueError: the file is empty or a row is not JSON or lacks a required field (its
        line number is named, never its content).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    records = []
    for number, record in json_objects(path):
        missing = [k for k in required if k not in record]
        if missing:
            raise ValueError(f"{path}:{number} lacks field(s) {missing}")
        records.append(record)
    if not records:
        raise ValueError(f"{path} holds no records")
    return records


def load_jsonl(path: str | Path, *, required: tuple[str, ...] = ()) -> datasets.Dataset:
    """`read_jsonl` as a `datasets.Dataset` (same checks and errors). A field whose rows
    hold different types (null aside) is named, never a value (Arrow's messages quote one)."""
    records = read_jsonl(path, required=required)
    try:
        return datasets.Dataset.from_list(records)
    except Exception:  # noqa: BLE001 (pyarrow's and datasets' errors quote a row's value)
        types: dict[str, set] = {}
        for record in records:
            for key, value in record.items():
                types.setdefault(key, set()).add(type(value))
        mixed = sorted(k for k, found in types.items() if len(found - {type(None)}) > 1)
        what = f"field(s) {mixed} hold values of different types" if mixed else "its rows"
        raise ValueError(f"{path}: {what} cannot be read as one table") from None


def load_rows(
    source: str | Path, required: tuple[str, ...] = (), limit: int | None = None, split: str = "all"
) -> datasets.Dataset:
    """A JSONL file, or the wiki asset (name or its JSON file), as a `datasets.Dataset`.

    `split` selects the shared train/test split by document (`split_by_document`, the split
    `retriever data wiki` writes) of the wiki corpus; JSONL files are used whole. `limit`
    keeps the first rows only.
    """
    path = Path(source)
    if path.suffix == ".jsonl":
        if split != "all":
            raise ValueError("--split applies to the wiki corpus; a JSONL file is used whole")
        ds = load_jsonl(path, required=required)
    else:
        ds = select_split(load_wiki_summaries(str(source)), split)
    return ds.select(range(min(limit, len(ds)))) if limit else ds


SELECTION_NOTE = (
    "{what} select rows by position in the whole data: adding or removing a row elsewhere "
    "can change which rows are selected, so the guarantee covers the selected rows only"
)


def selection_note(limit: int | None, split: str) -> str:
    """Which private rows a guarantee covers after `load_rows(limit=, split=)` (public: the
    options, never a count)."""
    chosen = [f"--split {split}"] * (split != "all") + [f"--limit {limit}"] * (limit is not None)
    if not chosen:
        return "all rows of the private data"
    return SELECTION_NOTE.format(what=" and ".join(chosen))
