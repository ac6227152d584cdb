"""An index built in 3 shards and merged is the unsharded build, file for file (CLI)."""

import json

import numpy as np
import pytest

from dpsynth.cli.retriever import app
from retriever import index_shards
from retriever.encoders import random_encoder, save_encoder
from synthgen.command_line import run
from synthgen.shards import Shard

WORDS = "city music film war game team school river mountain station data model".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """150 documents of varied length: 3 batches of `encode`'s 64, over several buckets."""
    rng = np.random.default_rng(0)
    rows = [
        {"doc_id": f"d{i}", "text": " ".join(rng.choice(WORDS, size=int(rng.integers(1, 60))))}
        for i in range(150)
    ]
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_three_shards_merge_to_the_unsharded_index(corpus, tmp_path):
    common = ["--corpus", str(corpus), "--encoder", "random:bert", "--kind", "exact"]
    assert run(app, ["index", "build", *common, "--out", str(tmp_path / "whole")]) == 0
    shards = [tmp_path / f"shard{i}" for i in range(3)]
    for i, folder in enumerate(shards):
        argv = ["index", "build", *common, "--out", str(folder), "--shard", f"{i}/3"]
        assert run(app, argv) == 0
    sizes = [len(np.load(f / "rows.npy")) for f in shards]
    assert sizes == [64, 64, 22]  # whole batches, in order
    argv = ["index", "merge", *map(str, shards[::-1]), "--out", str(tmp_path / "merged")]
    assert run(app, [*argv, "--kind", "exact"]) == 0
    assert _files(tmp_path / "merged") == _files(tmp_path / "whole")


def test_encode_shards_are_the_unsharded_rows_bit_for_bit():
    encoder = random_encoder("bert", seed=0)
    texts = [" ".join(WORDS[: 1 + i % 11] * (1 + i % 5)) for i in range(20)]
    whole = encoder.encode(texts, batch_size=4)
    seen = []
    for i in range(3):
        rows, part = encoder.encode_shard(texts, Shard(i, 3), batch_size=4)
        np.testing.assert_array_equal(part, whole[rows])
        seen += rows.tolist()
    assert sorted(seen) == list(range(20))


def test_merge_refuses_an_incomplete_or_foreign_set(corpus, tmp_path):
    for i in range(2):
        index_shards.encode_index_shard(
            corpus, tmp_path / f"s{i}", shard=Shard(i, 2), encoder="random:bert"
        )
    with pytest.raises(ValueError, match="shards 0..1 once"):
        index_shards.merge_index_shards([tmp_path / "s0"], tmp_path / "out")
    index_shards.encode_index_shard(
        corpus, tmp_path / "t1", shard=Shard(1, 3), encoder="random:bert"
    )
    with pytest.raises(ValueError, match="another build"):
        index_shards.merge_index_shards([tmp_path / "s0", tmp_path / "t1"], tmp_path / "out")
    with pytest.raises(ValueError, match="not an index shard"):
        index_shards.merge_index_shards([tmp_path], tmp_path / "out")


def test_merge_refuses_shards_whose_encoder_folder_was_retrained_between_them(corpus, tmp_path):
    """Same reference (the folder), same provenance, other weights: not one build."""
    folder = tmp_path / "encoder"
    first = random_encoder("bert", seed=0)
    save_encoder(first, first.params, folder)
    index_shards.encode_index_shard(corpus, tmp_path / "s0", shard=Shard(0, 2), encoder=str(folder))
    second = random_encoder("bert", seed=1)
    save_encoder(second, second.params, folder)
    index_shards.encode_index_shard(corpus, tmp_path / "s1", shard=Shard(1, 2), encoder=str(folder))
    records = [json.loads((tmp_path / s / "shard.json").read_text()) for s in ("s0", "s1")]
    assert records[0]["encoder"] == records[1]["encoder"]
    assert records[0]["encoder_weights_sha256"] != records[1]["encoder_weights_sha256"]
    with pytest.raises(ValueError, match="another build"):
        index_shards.merge_index_shards([tmp_path / "s0", tmp_path / "s1"], tmp_path / "out")
