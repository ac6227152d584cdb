"""The index folder `retriever index build` writes: searcher, encoder name and doc_ids."""

import json

import numpy as np
import pytest

from retriever import index_folder
from retriever.index import ExactSearcher


def test_save_then_read_back(tmp_path):
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(5, 8)).astype(np.float32)
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    out = tmp_path / "index"
    doc_ids = ["d0", "d1", "d2", "d3", "d4"]
    index_folder.save_index_folder(
        out, ExactSearcher(embeddings), encoder="all-minilm-l6-v2", doc_ids=doc_ids
    )
    meta = index_folder.read_index_meta(out)
    assert meta == {"encoder": "all-minilm-l6-v2", "doc_ids": doc_ids, "kind": "exact"}
    assert json.loads((out / index_folder.META_FILE).read_text()) == meta
    searcher = index_folder.load_index_searcher(out)
    scores, found = searcher.search(embeddings[[3]], 2)
    assert found[0, 0] == 3
    np.testing.assert_allclose(scores[0, 0], 1.0, rtol=1e-5)


def test_a_folder_without_index_json_is_not_an_index(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no index in .* \(missing index.json\)"):
        index_folder.read_index_meta(tmp_path)
