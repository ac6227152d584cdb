"""Round-trip consistency filter: exact ranks, keep-all at k = corpus size, the pairs a tiny
public encoder must keep and drop, de-duplication, the metadata's statement of the filter,
and the refusal of a trained encoder."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from dpsynth.cli.retriever import app
from retriever import consistency, provenance
from retriever.consistency import (
    FILTER_KIND,
    ConsistencyFilter,
    check_public_encoder,
    filter_pairs,
    filter_query_folder,
    source_ranks,
)
from synthgen.querygen import write_query_folder

ENCODER = "random:bert"  # a public random initialisation: tests need no asset
DOCS = {
    "a": "the river flooded the lower town twice during the spring",
    "b": "bake the bread at two hundred degrees until the crust is golden",
    "c": "the museum opens at nine and closes at six except on holidays",
    "d": "water the tomato plants every morning and keep them in the sun",
}
TINY = ConsistencyFilter(k=1, encoder=ENCODER, max_query_len=32, max_doc_len=32)


def test_source_ranks_match_a_full_sort_and_ties_favour_the_source(monkeypatch):
    rng = np.random.default_rng(0)
    q, d = rng.standard_normal((50, 8)), rng.standard_normal((30, 8))
    sources = rng.integers(0, 30, 50)
    scores = q @ d.T
    expected = [1 + np.sum(s > s[j]) for s, j in zip(scores, sources)]
    np.testing.assert_array_equal(source_ranks(q, d, sources), expected)
    monkeypatch.setattr(consistency, "SCORE_BLOCK", 7 * 30)  # blocks of 7 queries
    np.testing.assert_array_equal(source_ranks(q, d, sources), expected)
    same = np.ones((3, 4), np.float32)  # every document ties: each source ranks first
    assert source_ranks(same[:1], same, np.array([2])).tolist() == [1]


def _rows(*pairs):
    return [{"doc_id": d, "document": DOCS[d], "query": q} for d, q in pairs]


def test_keeps_a_query_that_leads_back_and_drops_one_that_does_not():
    rows = _rows(("a", DOCS["a"]), ("b", DOCS["c"]), ("d", DOCS["d"]))
    kept, record = filter_pairs(rows, list(DOCS), list(DOCS.values()), TINY)
    # a query equal to its document's text ranks it first (normalised embeddings: cosine 1);
    # b's query is c's text, so c outranks b
    assert [(r["doc_id"], r["query"]) for r in kept] == [("a", DOCS["a"]), ("d", DOCS["d"])]
    assert record["kept"] == 2 and record["queries_in"] == 3 and record["k"] == 1


def test_k_equal_to_the_corpus_size_keeps_every_query():
    rows = _rows(("a", "flood"), ("b", DOCS["c"]), ("c", "tomatoes"), ("d", "zzz qqq"))
    config = ConsistencyFilter(k=len(DOCS), encoder=ENCODER)
    kept, record = filter_pairs(rows, list(DOCS), list(DOCS.values()), config)
    assert kept == rows and record["kept"] == 4


def test_empty_and_repeated_pairs_are_dropped_unless_asked_not_to():
    rows = _rows(("a", "flood"), ("a", " flood "), ("b", ""), ("b", "flood"))
    keep_all = ConsistencyFilter(k=len(DOCS), encoder=ENCODER)
    kept, record = filter_pairs(rows, list(DOCS), list(DOCS.values()), keep_all)
    assert [(r["doc_id"], r["query"]) for r in kept] == [("a", "flood"), ("b", "flood")]
    assert record["dropped_empty_or_repeated"] == 2
    raw = ConsistencyFilter(k=len(DOCS), encoder=ENCODER, dedupe=False)
    assert filter_pairs(rows, list(DOCS), list(DOCS.values()), raw)[0] == rows


def test_bad_settings_and_unknown_documents_are_refused():
    with pytest.raises(ValueError, match="k must be >= 1"):
        ConsistencyFilter(k=0)
    with pytest.raises(ValueError, match="not in the corpus"):
        filter_pairs(_rows(("a", "x")), ["b"], [DOCS["b"]], TINY)


def test_a_trained_or_unrecorded_encoder_is_refused(tmp_path):
    check_public_encoder(ENCODER)  # public: passes
    unrecorded = tmp_path / "model"
    unrecorded.mkdir()
    with pytest.raises(ValueError, match="public pretrained"):
        check_public_encoder(str(unrecorded))
    hugging_face = tmp_path / "hf"  # a model folder of unrecorded origin: maybe fine-tuned
    hugging_face.mkdir()
    (hugging_face / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="public pretrained"):
        check_public_encoder(str(hugging_face))
    with pytest.raises(ValueError, match="public pretrained"):
        check_public_encoder(str(tmp_path / "no-such-folder"))
    provenance.write_provenance(unrecorded, provenance.real_data(num_pairs=10))
    with pytest.raises(ValueError, match="public pretrained"):
        filter_pairs(
            _rows(("a", "x")),
            list(DOCS),
            list(DOCS.values()),
            TINY.__class__(k=1, encoder=str(unrecorded)),
        )


def _release(folder):
    """A generator's output folder with its guarantee, as `generate_queries` writes it."""
    rows = _rows(("a", DOCS["a"]), ("b", DOCS["c"]), ("c", DOCS["c"]), ("c", DOCS["c"]))
    columns = {k: [r[k] for r in rows] for k in ("doc_id", "document", "query")}
    privacy = {"epsilon": 1.0, "delta": 1e-5, "privacy_unit": "one (document, query) pair"}
    write_query_folder(folder, columns, {"privacy": privacy, "generation": {"k": 1}}, 3)
    return privacy


def test_the_filtered_folder_keeps_the_guarantee_and_states_the_filter(tmp_path):
    privacy = _release(tmp_path / "synthetic")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"doc_id": d, "text": t}) + "\n" for d, t in DOCS.items()))
    result = CliRunner().invoke(
        app,
        ["data", "filter", "--queries", str(tmp_path / "synthetic"), "--corpus", str(corpus),
         "--out", str(tmp_path / "kept"), "--k", "1", "--encoder", ENCODER,
         "--max-doc-len", "32"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["kept"] == 2, result.stdout
    meta = json.loads((tmp_path / "kept" / "metadata.json").read_text())
    assert meta["privacy"] == privacy and meta["generation"] == {"k": 1}
    flt = meta["filter"]
    assert flt["kind"] == FILTER_KIND and flt["k"] == 1 and flt["encoder"] == ENCODER
    assert flt["queries_in"] == 4 and flt["kept"] == 2 and "no privacy budget" in flt["statement"]
    assert meta["num_queries"] == 2 and meta["num_documents"] == 2
    lines = (tmp_path / "kept" / "queries.jsonl").read_text().splitlines()
    assert [json.loads(x)["doc_id"] for x in lines] == ["a", "c"]
    with pytest.raises(ValueError, match="already filtered"):
        filter_query_folder(tmp_path / "kept", corpus, tmp_path / "again", TINY)
    with pytest.raises(ValueError, match="new folder"):
        filter_query_folder(tmp_path / "synthetic", corpus, tmp_path / "synthetic", TINY)
    edited = tmp_path / "synthetic" / "queries.jsonl"  # a real query slipped into the release
    row = {"doc_id": "a", "document": DOCS["a"], "query": "a private query"}
    edited.write_text(edited.read_text() + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match="not the file its generator wrote"):
        filter_query_folder(tmp_path / "synthetic", corpus, tmp_path / "edited", TINY)
    # the training side reads it as a release with a guarantee
    record = provenance.synthetic(meta, num_pairs=2, description="filtered")
    assert record["guarantee"]["epsilon"] == 1.0
