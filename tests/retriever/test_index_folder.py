"""The index folder `retriever index build` writes: searcher, the encoder (its absolute folder
and a copy of its provenance) and doc_ids; the checks every reader makes of that encoder."""

import json
import shutil

import numpy as np
import pytest

from dpsynth.cli.retriever import app
from retriever import index_folder
from retriever import provenance as prov
from retriever.encoders import random_encoder
from retriever.index import ExactSearcher
from retriever.train import save_trained
from synthgen.command_line import run

TEXTS = ["the city music film", "war game team school", "river mountain station", "data model"]
DP_STATEMENT = "post-processing of an (ε, δ)-DP release"


def _dp_provenance():
    privacy = {
        "epsilon": 2.0, "delta": 1e-5, "private": True, "neighboring_relation": "ADD_OR_REMOVE_ONE",
        "unit": "one (document, query) pair", "ledger_scope": {"tenant": "t", "dataset": "d"},
    }  # fmt: skip
    model = {"family": "t5", "base": "random:tiny", "lora_rank": 0}
    return prov.synthetic({"privacy": privacy, "model": model, "num_queries": 8}, num_pairs=8)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny encoder folder with a DP-synthetic provenance, and the corpus's embeddings."""
    encoder = random_encoder("bert", seed=0)
    folder = tmp_path_factory.mktemp("trained") / "encoder"
    save_trained(encoder, {"query": encoder.params}, folder, {}, provenance=_dp_provenance())
    return folder, encoder.encode(TEXTS)


@pytest.fixture
def run_folder(trained, tmp_path):
    """run/ with encoder/ (a copy of the trained folder), corpus.jsonl and index/ (format 2,
    built with the encoder typed as the relative path "encoder" from inside run/)."""
    folder, embeddings = trained
    root = tmp_path / "run"
    shutil.copytree(folder, root / "encoder")
    rows = [{"doc_id": f"d{i}", "text": t} for i, t in enumerate(TEXTS)]
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    index_folder.save_index_folder(
        root / "index", ExactSearcher(embeddings), encoder=str(root / "encoder"),
        doc_ids=[r["doc_id"] for r in rows],
    )  # fmt: skip
    (tmp_path / "elsewhere").mkdir()
    return root


def _format_1(index, encoder="encoder"):
    """Rewrites index.json as dpsynth wrote it before format 2: the encoder as typed."""
    meta = index_folder.read_index_meta(index)
    old = {"encoder": encoder, "doc_ids": meta["doc_ids"], "kind": meta["kind"]}
    (index / index_folder.META_FILE).write_text(json.dumps(old))


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
    assert meta == {
        "format": 2,
        "encoder": "all-minilm-l6-v2",
        "encoder_provenance": prov.pretrained("all-minilm-l6-v2"),
        "doc_ids": doc_ids,
        "kind": "exact",
    }
    assert json.loads((out / index_folder.META_FILE).read_text()) == meta
    searcher = index_folder.load_index_searcher(out)
    scores, found = searcher.search(embeddings[[3]], 2)
    assert found[0, 0] == 3
    np.testing.assert_allclose(scores[0, 0], 1.0, rtol=1e-5)


def test_a_folder_without_index_json_is_not_an_index(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no index in .* \(missing index.json\)"):
        index_folder.read_index_meta(tmp_path)


def test_build_records_the_absolute_encoder_and_a_query_works_from_another_folder(
    run_folder, monkeypatch
):
    monkeypatch.chdir(run_folder)
    index_folder.build_index_folder("corpus.jsonl", "built", encoder="encoder", kind="exact")
    meta = index_folder.read_index_meta(run_folder / "built")
    assert meta["encoder"] == str((run_folder / "encoder").resolve())
    assert meta["encoder_provenance"] == json.loads(
        (run_folder / "encoder/provenance.json").read_text()
    )
    monkeypatch.chdir(run_folder.parent / "elsewhere")
    hits = index_folder.search_index_folder(run_folder / "built", [TEXTS[2]], 2)
    assert hits[0][0]["doc_id"] == "d2"
    np.testing.assert_allclose(hits[0][0]["score"], 1.0, rtol=1e-4)


def test_a_moved_encoder_folder_is_refused_with_where_it_was_and_the_fix(run_folder):
    (run_folder / "encoder").rename(run_folder / "moved")
    with pytest.raises(FileNotFoundError) as refused:
        index_folder.index_encoder(run_folder / "index")
    message = str(refused.value)
    assert str((run_folder / "encoder").resolve()) in message and "moved or deleted" in message
    assert "--encoder PATH" in message and "retriever index build" in message
    reference, record = index_folder.index_encoder(
        run_folder / "index", encoder=run_folder / "moved"
    )
    assert reference == str((run_folder / "moved").resolve())
    assert record["statement"].startswith(DP_STATEMENT)
    # An export embeds nothing: it states the recorded copy without the folder.
    assert index_folder.index_encoder(run_folder / "index", load=False)[1] == record


def test_an_encoder_with_other_provenance_is_refused(run_folder, tmp_path):
    recorded = json.loads((run_folder / "encoder/provenance.json").read_text())
    tampered = {**recorded, "guarantee": {**recorded["guarantee"], "epsilon": 0.5}}
    prov.write_provenance(run_folder / "encoder", tampered)
    with pytest.raises(ValueError, match=r"not the one .* built with: .*\(in guarantee\b"):
        index_folder.index_encoder(run_folder / "index")
    prov.write_provenance(run_folder / "encoder", recorded)
    assert index_folder.index_encoder(run_folder / "index")[1] == recorded
    shutil.copytree(run_folder / "encoder", tmp_path / "other")
    prov.write_provenance(tmp_path / "other", prov.real_data(num_pairs=8))
    with pytest.raises(ValueError, match=r"the encoder .*other is not the one .* built with"):
        index_folder.index_encoder(run_folder / "index", encoder=tmp_path / "other")
    with pytest.raises(ValueError, match="pretrained model all-minilm-l6-v2"):
        index_folder.index_encoder(run_folder / "index", encoder="all-minilm-l6-v2")


def test_a_format_1_index_still_loads_beside_its_encoder_with_a_warning(
    run_folder, monkeypatch, capsys
):
    _format_1(run_folder / "index")
    monkeypatch.chdir(run_folder.parent / "elsewhere")  # "encoder" is beside the index
    reference, record = index_folder.index_encoder(run_folder / "index")
    assert reference == str((run_folder / "encoder").resolve())
    assert record["statement"].startswith(DP_STATEMENT)
    warning = capsys.readouterr().err
    assert warning.startswith("warning: ") and "format 1" in warning
    assert len(warning.strip().splitlines()) == 1
    monkeypatch.chdir(run_folder)  # as before: relative to the working directory
    assert index_folder.index_encoder("index")[0] == reference
    (run_folder / "encoder").rename(run_folder / "moved")
    with pytest.raises(
        FileNotFoundError, match=r"built with the encoder 'encoder' .*, which is not in .* nor in "
    ):
        index_folder.index_encoder(run_folder / "index")


def test_cli_query_of_a_moved_encoder_is_one_line_and_exit_1(run_folder, capsys):
    (run_folder / "encoder").rename(run_folder / "moved")
    code = run(app, ["index", "query", "--index", str(run_folder / "index"), "--query", "x"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "moved or deleted" in err and "--encoder PATH" in err


@pytest.mark.parametrize(
    ("option", "value"),
    [("--kind", "faiss"), ("--encoder", "no-such-encoder"), ("--out", "corpus.jsonl")],
)
def test_cli_build_refuses_bad_options_before_embedding(
    option, value, run_folder, monkeypatch, capsys
):
    import retriever.evaluate

    def never(*_, **__):
        raise AssertionError("the encoder was loaded before the options were checked")

    monkeypatch.setattr(retriever.evaluate, "load_towers", never)
    monkeypatch.chdir(run_folder)
    args = {"--corpus": "corpus.jsonl", "--out": "new-index", "--encoder": "encoder"}
    args[option] = value
    code = run(app, ["index", "build", *[x for kv in args.items() for x in kv]])
    err = capsys.readouterr().err
    assert code == 2 and option in err, err
    assert not (run_folder / "new-index").exists()


def test_build_refuses_an_unknown_kind_before_reading_the_corpus(tmp_path):
    with pytest.raises(ValueError, match="kind must be one of .*got kind='faiss'"):
        index_folder.build_index_folder(tmp_path / "missing.jsonl", tmp_path / "i", kind="faiss")
