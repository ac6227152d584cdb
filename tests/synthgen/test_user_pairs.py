"""A user's own pairs: read with renamed fields, by text or by id, and refused line by line."""

import json

import pytest

from synthgen.user_pairs import (
    MIN_DOCUMENTS,
    PairsFileError,
    PairsSource,
    read_pairs,
    split_collection,
)


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def _collection(tmp_path, n=12):
    return _write(
        tmp_path / "docs.jsonl",
        [
            {"id": f"kb-{i}", "body": f"Article {i} about topic {i}.", "name": f"T{i}"}
            for i in range(n)
        ],
    )


def _log(tmp_path, n=12, per=2):
    return [
        {"clicked": f"kb-{i}", "q": f"how to {i} number {j}"} for i in range(n) for j in range(per)
    ]


def _source(tmp_path, pairs, documents=True):
    return PairsSource(
        pairs,
        _collection(tmp_path) if documents else None,
        query_field="q",
        doc_id_field="clicked",
        text_field="body",
        document_field="article",
        id_field="id",
    )


def test_pairs_by_id_into_a_collection_with_renamed_fields(tmp_path):
    pairs = _write(tmp_path / "log.jsonl", _log(tmp_path))
    source = _source(tmp_path, pairs)
    # the collection names its ids "id", the log "clicked"; 14 documents, 12 clicked
    _write(tmp_path / "docs.jsonl", [{"id": f"kb-{i}", "body": f"Article {i}."} for i in range(14)])
    collection, rows = read_pairs(source)
    assert len(collection) == 14 and len(rows) == 24  # the collection is indexed whole
    assert rows[0] == {"doc_id": "kb-0", "document": "Article 0.", "query": "how to 0 number 0"}


def test_pairs_holding_the_text_make_their_own_collection(tmp_path):
    rows = [{"article": f"Text {i % 12}", "q": f"q{i}"} for i in range(30)]
    source = _source(tmp_path, _write(tmp_path / "p.jsonl", rows), documents=False)
    collection, pairs = read_pairs(source)
    assert len(collection) == 12 and len(pairs) == 30
    assert len({p["doc_id"] for p in pairs}) == 12  # identical texts are one document


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["{not json"], r"log\.jsonl:1: not valid JSON"),
        (
            [{"clicked": "kb-1", "q": "fine"}, {"clicked": "kb-2", "q": "  "}],
            r":2: empty 'q' field",
        ),
        (
            [{"clicked": "kb-1", "q": "fine"}, {"clicked": "kb-99", "q": "x"}],
            r":2: document id not in",
        ),
        ([{"clicked": "kb-1"}], r":1: no 'q' field"),
        ([{"clicked": "kb-1", "q": True}], r":1: 'q' field is not a string or an integer"),
        ([{"clicked": f"kb-{i % 3}", "q": "x"} for i in range(9)], r"name 3 distinct documents"),
    ],
)
def test_each_bad_pairs_file_is_one_line_naming_the_line(tmp_path, rows, message):
    source = _source(tmp_path, _write(tmp_path / "log.jsonl", rows))
    with pytest.raises(PairsFileError, match=message) as error:
        read_pairs(source)
    assert "\n" not in str(error.value) and "fine" not in str(error.value)  # never content


def test_a_collection_that_repeats_an_id_is_refused_with_both_lines(tmp_path):
    source = _source(tmp_path, _write(tmp_path / "log.jsonl", _log(tmp_path)))
    _write(tmp_path / "docs.jsonl", [{"id": "a", "body": "x"}] * 2)
    docs = PairsSource(
        source.pairs, source.documents, doc_id_field="clicked", text_field="body", id_field="id"
    )
    with pytest.raises(
        PairsFileError, match=r"docs\.jsonl:2: document id repeated \(first on line 1\)"
    ):
        read_pairs(docs)


def test_ids_without_a_collection_say_what_to_pass(tmp_path):
    source = _source(tmp_path, _write(tmp_path / "log.jsonl", _log(tmp_path)), documents=False)
    with pytest.raises(PairsFileError, match="--documents FILE"):
        read_pairs(source)


def test_the_split_holds_out_collection_documents_and_targets_never_follow_the_pairs():
    """Held-out documents and targets are a function of the public collection and the seed:
    adding or removing a pair (which documents were clicked) changes neither."""
    collection = [{"doc_id": f"d{i}", "text": f"t{i}"} for i in range(20)]
    pairs = [{"doc_id": f"d{i % 12}", "query": f"q{i}"} for i in range(36)]
    train, test, targets = split_collection(collection, pairs, test_fraction=0.2, seed=0)
    held = {d["doc_id"] for d in collection} - {t["doc_id"] for t in targets}
    assert len(held) == 4 and len(targets) == 16 and len(train) + len(test) == 36
    assert {p["doc_id"] for p in test} <= held and not {p["doc_id"] for p in train} & held
    fewer = split_collection(collection, pairs[:-1], test_fraction=0.2, seed=0)
    assert fewer[2] == targets  # one pair fewer: the same targets
    assert split_collection(collection, pairs, test_fraction=0.2, seed=1)[2] != targets
    assert MIN_DOCUMENTS == 10
