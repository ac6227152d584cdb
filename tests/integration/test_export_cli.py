"""`retriever export` and `retriever index export` as a user runs them: train on a DP
release's synthetic pairs, evaluate, export with the evaluation in the card, index, export
the index rows."""

import json
import os

import cli_process
import pytest

from synthgen.corpora import file_sha256

WORDS = "city music film war game team school state river mountain station history".split()


def _retriever(*args, env=None):
    return cli_process.command("retriever", *args, env=env)


def _write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _release(tmp_path):
    """A corpus, held-out queries, and a DP release's synthetic pairs with its metadata."""
    docs = [
        {"doc_id": f"d{i}", "text": f"the {w} of the {v} in year {i}"}
        for i, (w, v) in enumerate(zip(WORDS, WORDS[3:] + WORDS[:3]))
    ]
    _write_jsonl(tmp_path / "corpus.jsonl", docs)
    _write_jsonl(
        tmp_path / "test.jsonl",
        [{"query": f"{d['text'][4:14]}?", "doc_id": d["doc_id"]} for d in docs],
    )
    pairs = [
        {"doc_id": d["doc_id"], "document": d["text"], "query": f"which {d['text'].split()[1]}"}
        for d in docs
    ]
    _write_jsonl(tmp_path / "synthetic" / "queries.jsonl", pairs)
    privacy = {
        "epsilon": 1.0, "delta": 1e-5, "private": True, "neighboring_relation": "ADD_OR_REMOVE_ONE",
        "unit": "one (document, query) pair; queries private, documents public",
        "ledger_scope": {"tenant": "acme", "dataset": "pairs"},
    }  # fmt: skip
    metadata = {
        "privacy": privacy,
        "model": {"family": "t5", "base": "random:tiny", "lora_rank": 0},
        "num_queries": len(pairs),
        "files": {"queries.jsonl": file_sha256(tmp_path / "synthetic" / "queries.jsonl")},
    }
    (tmp_path / "synthetic" / "metadata.json").write_text(json.dumps(metadata))


@pytest.mark.slow
def test_train_evaluate_export_index_export(tmp_path):
    _release(tmp_path)
    # The default work folder lives beside the (here: temporary) ledger.
    env = {**os.environ, "DPSYNTH_LEDGER": str(tmp_path / "private" / "ledger.sqlite")}
    model = tmp_path / "model"
    trained = _retriever(
        "train", "--pairs", tmp_path / "synthetic" / "queries.jsonl", "--out", model,
        "--encoder", "random:bert", "--batch-size", "4", "--epochs", "1", env=env,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    summary = json.loads(trained.stdout.strip().splitlines()[-1])
    assert summary["statement"].startswith("post-processing of an (ε, δ)-DP release")
    assert sorted(p.name for p in model.iterdir()) == [
        "encoder.json", "params.msgpack", "provenance.json"
    ]  # fmt: skip
    assert not any((tmp_path / "private" / "work").glob("*"))  # resume state removed

    report_file = tmp_path / "report.json"
    evaluated = _retriever(
        "evaluate", "--encoder", model, "--corpus", tmp_path / "corpus.jsonl", "--queries",
        tmp_path / "test.jsonl", "--out", report_file,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    assert f"encoder={model.resolve()}" in evaluated.stdout
    report = json.loads(report_file.read_text())
    assert report["encoder"] == str(model.resolve()) and report["base"] == "random:bert"
    assert report["statement"] == summary["statement"]

    out = tmp_path / "st"
    exported = _retriever(
        "export", "--encoder", model, "--format", "sentence-transformers", "--out", out,
        "--evaluation", report_file,
    )  # fmt: skip
    assert exported.returncode == 0 and "figures are not DP" in exported.stderr, exported.stderr
    assert json.loads(exported.stdout)["statement"] == summary["statement"]
    card = (out / "README.md").read_text()
    assert summary["statement"] in card and f"{report['ndcg@10']:.4f}" in card
    assert {"model.safetensors", "config.json", "modules.json", "provenance.json"} <= {
        p.name for p in out.iterdir()
    }
    again = _retriever("export", "--encoder", model, "--out", out)
    assert again.returncode == 1 and again.stderr.count("\n") == 1 and "not empty" in again.stderr

    index = tmp_path / "index"
    built = _retriever(
        "index", "build", "--encoder", model, "--corpus", tmp_path / "corpus.jsonl",
        "--out", index, "--kind", "exact",
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    rows = tmp_path / "rows.parquet"
    result = _retriever("index", "export", "--index", index, "--format", "parquet", "--out", rows)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["rows"] == 12

    import pyarrow.parquet as pq

    table = pq.read_table(rows)
    assert table.num_rows == 12 and table.schema.field("embedding").type.list_size == 64
    meta = json.loads(table.schema.metadata[b"dpsynth"])
    assert meta["provenance"]["statement"] == summary["statement"]
    assert "no privacy guarantee for them" in meta["corpus_statement"]  # rows of the corpus
    assert meta["provenance"]["guarantee"]["ledger_scope"] == {"tenant": "acme", "dataset": "pairs"}
