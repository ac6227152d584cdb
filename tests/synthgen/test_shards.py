"""Shards: whole generation batches in order, every document once; merging refuses mismatches."""

import json

import pytest

from synthgen import querygen
from synthgen.corpora import file_sha256
from synthgen.shards import Shard


@pytest.mark.parametrize("total, batch, count", [(12, 4, 3), (13, 4, 3), (5, 4, 3), (100, 7, 8)])
def test_shards_cover_whole_batches_once(total, batch, count):
    ranges = [Shard(i, count).document_range(total, batch) for i in range(count)]
    assert ranges[0][0] == 0 and ranges[-1][1] == total
    for (_, end), (first, _) in zip(ranges, ranges[1:], strict=False):
        assert end == first  # contiguous, in order
    for first, end in ranges:
        assert first % batch == 0 and (end % batch == 0 or end == total)


def test_parse():
    assert Shard.parse(" 2/8 ") == Shard(2, 8) and str(Shard(2, 8)) == "2/8"
    for bad in ("8/8", "-1/2", "1", "a/b", "1/0"):
        with pytest.raises(ValueError, match="I/N"):
            Shard.parse(bad)


def _shard_folder(path, index, count, documents, total, seed="a", rows=()):
    path.mkdir(parents=True)
    lines = [json.dumps({"doc_id": d, "document": f"doc {d}", "query": q}) for d, q in rows]
    (path / "queries.jsonl").write_text("".join(line + "\n" for line in lines))
    meta = {
        "files": {"queries.jsonl": file_sha256(path / "queries.jsonl")},
        "privacy": {"epsilon": 1.0},
        "model": {},
        "generator_config": {},
        "generation": {"seconds": 1.0, "top_p": 1.0},
        "shard": {
            "index": index,
            "count": count,
            "documents": documents,
            "total_documents": total,
            "seed_sha256": seed,
            "documents_sha256": "docs",
            "generator_sha256": "weights",
            "platform": {"jax": "x", "backend": "cpu", "device": "cpu"},
        },
    }
    (path / "metadata.json").write_text(json.dumps(meta))
    return path


def test_merge_refuses_mismatched_shards(tmp_path):
    a = _shard_folder(tmp_path / "a", 0, 2, [0, 2], 4, rows=[(0, "q0"), (1, "q1")])
    b = _shard_folder(tmp_path / "b", 1, 2, [2, 4], 4, rows=[(2, "q2"), (3, "q3")])
    other_seed = _shard_folder(tmp_path / "c", 1, 2, [2, 4], 4, seed="b")
    gap = _shard_folder(tmp_path / "d", 1, 2, [3, 4], 4)
    with pytest.raises(ValueError, match="shards 0..1 once"):
        querygen.merge_query_shards([a], tmp_path / "out1")
    with pytest.raises(ValueError, match="another job"):
        querygen.merge_query_shards([a, other_seed], tmp_path / "out2")
    with pytest.raises(ValueError, match="starts at document 3"):
        querygen.merge_query_shards([a, gap], tmp_path / "out3")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "metadata.json").write_text("{}")
    with pytest.raises(ValueError, match="not a shard"):
        querygen.merge_query_shards([tmp_path / "plain"], tmp_path / "out4")
    with pytest.raises(ValueError, match="no shard folders"):
        querygen.merge_query_shards([], tmp_path / "out5")
    (b / "queries.jsonl").write_text("")  # truncated after the shard was written
    with pytest.raises(ValueError, match="not the file its shard wrote"):
        querygen.merge_query_shards([a, b], tmp_path / "out6")
    b = _shard_folder(tmp_path / "b2", 1, 2, [2, 4], 4, rows=[(2, "q2"), (3, "q3")])
    merged = querygen.merge_query_shards([b, a], tmp_path / "out")
    assert merged["query"] == ["q0", "q1", "q2", "q3"]
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["num_documents"] == 4 and meta["merged_shards"] == 2
    assert meta["generation"]["seconds"] == 2.0 and "shard" not in meta
