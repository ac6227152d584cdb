"""`retriever.export`: trained encoders in the base's Hugging Face / sentence-transformers
layout (round trip through the project's own loader, and sentence-transformers where it is
installed), their provenance and model card, and index embeddings as Parquet."""

import json
import shutil

import jax
import numpy as np
import pytest
from safetensors import safe_open

from retriever import export
from retriever import provenance as prov
from retriever.bert import read_hf_tensors
from retriever.encoders import load_encoder, random_encoder
from retriever.index import ExactSearcher, ScannSearcher
from retriever.index_folder import save_index_folder
from retriever.train import save_trained
from synthgen import assets

ST_MISSING = "sentence-transformers is not installed (optional; not a dependency)"
WORDS = (
    "the city music film war game team school data model text search query document private "
    "retrieval world people state year university first new history river mountain station"
).split()
# 50 texts of 3 to 40 words, a few with punctuation, digits and capitals, and 3 of 300
# words (truncated: longer than every max length).
TEXTS = [
    " ".join(np.random.default_rng(i).choice(WORDS, size=300 if i % 17 == 3 else 3 + (i * 7) % 38))
    + (f", No. {i}!" if i % 5 == 0 else "")
    for i in range(50)
]
STATEMENT = "post-processing of an (ε, δ)-DP release"


def _metadata():
    privacy = {
        "epsilon": 1.0, "delta": 1e-5, "private": True, "neighboring_relation": "ADD_OR_REMOVE_ONE",
        "unit": "one (document, query) pair; queries private, documents public",
        "ledger_scope": {"tenant": "acme", "dataset": "pairs"},
    }  # fmt: skip
    model = {"family": "t5", "base": "random:tiny", "lora_rank": 0}
    return {"privacy": privacy, "model": model, "num_queries": 64}


def _perturbed(params, seed, scale):
    """Params moved off the base, as training would (each leaf by scale x its own std)."""
    leaves, tree = jax.tree.flatten(params)
    key = jax.random.key(seed)
    moved = []
    for i, leaf in enumerate(leaves):
        noise = jax.random.normal(jax.random.fold_in(key, i), leaf.shape)
        moved.append(leaf + scale * (float(np.std(leaf)) or 1.0) * noise)
    return jax.tree.unflatten(tree, moved)


def _trained(encoder, folder, *, doc_tower=False, scale=0.05):
    params = {"query": _perturbed(encoder.params, 1, scale)}
    if doc_tower:
        params["doc"] = _perturbed(encoder.params, 2, scale)
    record = prov.synthetic(_metadata(), num_pairs=64)
    training = {"config": {"max_query_len": 32, "max_doc_len": 64}, "steps": 1}
    save_trained(encoder, params, folder, {"training": training}, provenance=record)
    return params


def _parquet_metadata(path):
    """The ``dpsynth`` schema metadata of a Parquet file `export_index` wrote."""
    import pyarrow.parquet as pq

    return json.loads(pq.read_schema(path).metadata[export.PARQUET_METADATA_KEY])


def _min_cosine(a, b):
    return float(
        np.min(np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))
    )


@pytest.fixture(scope="module")
def minilm_export(tmp_path_factory):
    """all-MiniLM-L6-v2 with moved weights, saved as `retriever train` does, and exported."""
    root = tmp_path_factory.mktemp("minilm")
    encoder = load_encoder("all-minilm-l6-v2")
    params = _trained(encoder, root / "encoder", scale=0.01)
    summary = export.export_encoder(root / "encoder", root / "st")
    return encoder, params, root, summary


def test_minilm_round_trip_through_the_hf_loader(minilm_export):
    encoder, params, root, summary = minilm_export
    trained = encoder.encode(TEXTS, params=params["query"])
    reloaded = load_encoder(root / "st")  # the loader that reads the base asset
    assert reloaded.family == "bert" and reloaded.max_len == encoder.max_len == 256
    exported = reloaded.encode(TEXTS)
    assert _min_cosine(trained, exported) >= 0.99999
    assert not np.allclose(trained, encoder.encode(TEXTS), atol=1e-3)  # the weights moved
    assert summary["base"] == "all-minilm-l6-v2" and summary["licence"] == "Apache-2.0"


def test_minilm_export_has_the_base_layout(minilm_export):
    _, _, root, _ = minilm_export
    base, out = assets.resolve("all-minilm-l6-v2"), root / "st"
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        assert (out / name).read_bytes() == (base / name).read_bytes(), name
    assert json.loads((out / "config.json").read_text()) == json.loads(
        (base / "config.json").read_text()
    )
    modules = json.loads((base / "modules.json").read_text())
    assert json.loads((out / "modules.json").read_text()) == modules  # Transformer, mean, norm
    pooling = json.loads((base / "1_Pooling" / "config.json").read_text())
    got = json.loads((out / "1_Pooling" / "config.json").read_text())
    assert {k: got[k] for k in pooling} == pooling
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 256
    with safe_open(str(out / "model.safetensors"), "numpy") as f:
        names = set(f.keys())
        assert f.metadata() == {"format": "pt"}
        assert f.get_tensor("pooler.dense.weight").dtype == np.float32
    base_tensors = read_hf_tensors(base)
    assert names == set(base_tensors) - {"embeddings.position_ids"}  # same names, by name
    exported = read_hf_tensors(out)
    for name in names:
        assert exported[name].shape == base_tensors[name].shape, name
    np.testing.assert_array_equal(
        exported["pooler.dense.weight"], base_tensors["pooler.dense.weight"]
    )
    assert not (out / "encoder.json").exists() and not (out / "params.msgpack").exists()
    assert not (out / "checkpoints").exists()
    # Modes of an ordinary folder to ship: the weights as readable as the JSON files.
    mode = (out / "config.json").stat().st_mode & 0o777
    assert (out / "model.safetensors").stat().st_mode & 0o777 == mode
    assert out.stat().st_mode & 0o777 == (out / "1_Pooling").stat().st_mode & 0o777


@pytest.mark.parametrize("family", ["bert", "t5"])
def test_random_encoders_round_trip_with_a_written_tokenizer(family, tmp_path):
    encoder = random_encoder(family, seed=0)
    params = _trained(encoder, tmp_path / "encoder")
    export.export_encoder(tmp_path / "encoder", tmp_path / "st")
    config = json.loads((tmp_path / "st" / "config.json").read_text())
    assert config["architectures"] == ["BertModel" if family == "bert" else "T5EncoderModel"]
    reloaded = load_encoder(tmp_path / "st")
    assert reloaded.family == family and reloaded.max_len == encoder.max_len
    trained = encoder.encode(TEXTS, params=params["query"])
    assert _min_cosine(trained, reloaded.encode(TEXTS)) >= 0.99999
    if family == "t5":
        with safe_open(str(tmp_path / "st" / "model.safetensors"), "numpy") as f:
            assert not any(name.startswith(("decoder.", "lm_head")) for name in f.keys())


def test_provenance_and_model_card_travel_with_the_export(minilm_export, tmp_path):
    _, _, root, summary = minilm_export
    source = json.loads((root / "encoder" / "provenance.json").read_text())
    assert json.loads((root / "st" / "provenance.json").read_text()) == source
    assert summary["statement"] == source["statement"] and source["statement"].startswith(STATEMENT)
    card = (root / "st" / "README.md").read_text()
    assert source["statement"] in card and "license: apache-2.0" in card
    assert "`all-minilm-l6-v2`" in card and "tenant 'acme', dataset 'pairs'" in card
    assert "No evaluation figures" in card
    assert "truncated to 256 tokens" in card and "`model.max_seq_length = 64`" in card
    # With an evaluation report of this very folder, its figures go into the card.
    report = {
        "ndcg@10": 0.5, "recall@10": 0.75, "mrr@10": 0.4, "num_queries": 12,
        "num_documents": 60, "index": "exact", "encoder": str((root / "encoder").resolve()),
    }  # fmt: skip
    encoder = random_encoder("bert")
    _trained(encoder, tmp_path / "enc")
    with pytest.raises(ValueError, match="evaluation report is of encoder"):
        export.export_encoder(tmp_path / "enc", tmp_path / "st", evaluation=report)
    assert not (tmp_path / "st").exists()  # refused before anything is written
    export.export_encoder(
        tmp_path / "enc", tmp_path / "st", evaluation={**report, "encoder": str(tmp_path / "enc")}
    )
    card = (tmp_path / "st" / "README.md").read_text()
    assert "| 0.5000 | 0.7500 | 0.4000 |" in card and "not covered by the" in card
    assert "license:" not in card  # a random base has no licence to state


def test_a_separate_document_tower_is_exported_beside(tmp_path):
    encoder = random_encoder("bert", seed=0)
    params = _trained(encoder, tmp_path / "encoder", doc_tower=True)
    summary = export.export_encoder(tmp_path / "encoder", tmp_path / "st")
    assert summary["towers"] == [str(tmp_path / "st"), str(tmp_path / "st" / "doc_tower")]
    docs = load_encoder(tmp_path / "st" / "doc_tower").encode(TEXTS[:10])
    assert _min_cosine(docs, encoder.encode(TEXTS[:10], params=params["doc"])) >= 0.99999
    assert (tmp_path / "st" / "doc_tower" / "provenance.json").is_file()
    assert "doc_tower/" in (tmp_path / "st" / "README.md").read_text()


def test_weights_convert_by_name_with_a_shape_check():
    encoder = random_encoder("bert", seed=0)
    tensors = export.bert_hf_tensors(encoder)
    np.testing.assert_array_equal(
        tensors["encoder.layer.1.attention.self.query.weight"],
        np.asarray(encoder.params["layer_1"]["query"]["kernel"]).T,
    )
    bad = jax.tree.map(lambda x: x, encoder.params)
    bad["layer_0"]["query"]["kernel"] = bad["layer_0"]["query"]["kernel"][:, :-1]
    encoder.params = bad
    with pytest.raises(ValueError, match="layer_0/query/kernel' has shape"):
        export.bert_hf_tensors(encoder)
    extra = random_encoder("bert", seed=0)
    extra.params = {**extra.params, "head": {"kernel": np.zeros((2, 2), np.float32)}}
    with pytest.raises(ValueError, match="no Hugging Face name for parameter 'head/kernel'"):
        export.bert_hf_tensors(extra)
    base = {"encoder.layer.0.output.dense.bias": np.zeros(3, np.float32)}
    with pytest.raises(ValueError, match="the base's"):
        export.bert_hf_tensors(random_encoder("bert", seed=0), base)


def test_bad_requests_are_refused(tmp_path, monkeypatch):
    encoder = random_encoder("bert", seed=0)
    _trained(encoder, tmp_path / "encoder")
    with pytest.raises(FileNotFoundError, match="no trained encoder"):
        export.export_encoder(tmp_path, tmp_path / "st")
    with pytest.raises(ValueError, match="format must be one of"):
        export.export_encoder(tmp_path / "encoder", tmp_path / "st", format="onnx")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        export.export_encoder(tmp_path / "encoder", tmp_path / "full")
    with pytest.raises(ValueError, match="inside the encoder folder"):
        export.export_encoder(tmp_path / "encoder", tmp_path / "encoder" / "st")

    def fail(*args, **kwargs):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(export, "model_card", fail)  # after the weights are written
    with pytest.raises(RuntimeError, match="interrupted"):
        export.export_encoder(tmp_path / "encoder", tmp_path / "out" / "st")
    assert list((tmp_path / "out").iterdir()) == []  # no half-written export is left


@pytest.mark.parametrize("kind", ["exact", "scann-bf"])
def test_index_export_writes_rows_and_provenance_to_parquet(kind, tmp_path):
    import pyarrow.parquet as pq

    encoder = random_encoder("bert", seed=0)
    _trained(encoder, tmp_path / "encoder")
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(7, 16)).astype(np.float32)
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    searcher = (
        ExactSearcher(embeddings) if kind == "exact" else ScannSearcher.build(embeddings, kind=kind)
    )
    doc_ids = [f"d{i}" for i in range(7)]
    save_index_folder(
        tmp_path / "index", searcher, encoder=str(tmp_path / "encoder"), doc_ids=doc_ids
    )
    summary = export.export_index(tmp_path / "index", tmp_path / "out" / "rows.parquet")
    assert summary["rows"] == 7 and summary["dim"] == 16
    table = pq.read_table(tmp_path / "out" / "rows.parquet")
    assert table.column_names == ["doc_id", "embedding"]
    assert table.column("doc_id").to_pylist() == doc_ids
    np.testing.assert_array_equal(
        np.array(table.column("embedding").to_pylist(), np.float32), embeddings
    )
    meta = _parquet_metadata(tmp_path / "out" / "rows.parquet")
    assert meta["provenance"] == json.loads((tmp_path / "encoder" / "provenance.json").read_text())
    assert meta["encoder"] == str(tmp_path / "encoder") and meta["dim"] == 16
    assert meta["provenance"]["statement"].startswith(STATEMENT)
    with pytest.raises(ValueError, match="exists"):
        export.export_index(tmp_path / "index", tmp_path / "out" / "rows.parquet")
    # The encoder folder moved: the DP statement recorded in index.json is still written.
    (tmp_path / "encoder").rename(tmp_path / "moved")
    export.export_index(tmp_path / "index", tmp_path / "moved.parquet")
    moved = _parquet_metadata(tmp_path / "moved.parquet")
    assert moved["provenance"] == meta["provenance"]
    (
        tmp_path / "index" / "searcher" / ("embeddings.npy" if kind == "exact" else "dataset.npy")
    ).unlink()
    with pytest.raises(ValueError, match="keeps no float32 embeddings"):
        export.export_index(tmp_path / "index", tmp_path / "other.parquet")


def test_index_export_of_a_format_1_index_never_drops_the_provenance(tmp_path, capsys):
    """An index.json of format 1 holds no copy of the provenance: the encoder's own is
    written (found beside the index, with a warning), or the export is refused."""
    encoder = random_encoder("bert", seed=0)
    _trained(encoder, tmp_path / "encoder")
    save_index_folder(
        tmp_path / "index", ExactSearcher(np.eye(3, 8, dtype=np.float32)),
        encoder=str(tmp_path / "encoder"), doc_ids=["a", "b", "c"],
    )  # fmt: skip
    old = {"encoder": "encoder", "doc_ids": ["a", "b", "c"], "kind": "exact"}
    (tmp_path / "index" / "index.json").write_text(json.dumps(old))
    export.export_index(tmp_path / "index", tmp_path / "rows.parquet")
    meta = _parquet_metadata(tmp_path / "rows.parquet")
    assert meta["provenance"]["statement"].startswith(STATEMENT)
    assert "warning: " in capsys.readouterr().err
    (tmp_path / "encoder").rename(tmp_path / "moved")
    with pytest.raises(FileNotFoundError, match="--encoder PATH"):
        export.export_index(tmp_path / "index", tmp_path / "refused.parquet")
    assert not (tmp_path / "refused.parquet").exists()
    export.export_index(tmp_path / "index", tmp_path / "again.parquet", encoder=tmp_path / "moved")
    again = _parquet_metadata(tmp_path / "again.parquet")
    assert again["provenance"] == meta["provenance"]


# ---- with sentence-transformers installed (optional) ---------------------------------------


@pytest.mark.parametrize("family", ["minilm", "bert", "t5"])
def test_sentence_transformers_embeds_the_export_as_the_encoder_does(
    family, minilm_export, tmp_path
):
    pytest.importorskip("sentence_transformers", reason=ST_MISSING)
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(2)
    if family == "minilm":
        encoder, params, root, _ = minilm_export
        folder = root / "st"
    else:
        encoder = random_encoder(family, seed=0)
        params = _trained(encoder, tmp_path / "encoder")
        folder = tmp_path / "st"
        export.export_encoder(tmp_path / "encoder", folder)
    ours = encoder.encode(TEXTS, params=params["query"], max_len=encoder.max_len)
    theirs = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_numpy=True)
    difference = float(np.abs(theirs - ours).max())
    print(f"{family}: max |sentence-transformers - ours| = {difference:.3g}, "
          f"min cosine = {_min_cosine(theirs, ours):.8f}")  # fmt: skip
    assert difference <= 1e-4
    model_class = transformers.AutoModel if family != "t5" else transformers.T5EncoderModel
    _, info = model_class.from_pretrained(str(folder), output_loading_info=True)
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    if family == "minilm":  # the base's pooler travels: nothing is newly initialised
        assert not info["missing_keys"]


def test_exported_folder_copies_anywhere(minilm_export, tmp_path):
    """The export is self-contained: a copy loads without the encoder folder or its base."""
    encoder, params, root, _ = minilm_export
    shutil.copytree(root / "st", tmp_path / "shipped")
    again = load_encoder(tmp_path / "shipped").encode(TEXTS[:5])
    assert _min_cosine(again, encoder.encode(TEXTS[:5], params=params["query"])) >= 0.99999
