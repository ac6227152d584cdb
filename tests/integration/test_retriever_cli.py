"""`retriever` end to end as a user runs it: data -> train -> evaluate -> index -> query."""

import json
import shutil

import cli_process
import pytest


def _retriever(*args):
    return cli_process.command("retriever", *args)


@pytest.mark.slow
def test_train_evaluate_index_query(tmp_path):
    data = tmp_path / "data"
    assert _retriever("data", "wiki", "--out", data, "--limit", "60").returncode == 0
    corpus, test = data / "corpus.jsonl", data / "test_queries.jsonl"

    zero = _retriever(
        "evaluate", "--encoder", "all-minilm-l6-v2", "--corpus", corpus, "--queries", test, "--json"
    )
    assert zero.returncode == 0, zero.stderr
    report = json.loads(zero.stdout.strip().splitlines()[-1])
    assert report["num_queries"] == 12 and report["num_documents"] == 60
    assert {"ndcg@10", "recall@10", "mrr@10"} <= set(report)
    assert report["recall@10"] > 0.5  # the pretrained encoder finds most of them

    model = tmp_path / "model"
    trained = _retriever(
        "train",
        "--pairs",
        data / "train_queries.jsonl",
        "--corpus",
        corpus,
        "--out",
        model,
        "--batch-size",
        "8",
        "--limit",
        "16",
    )
    assert trained.returncode == 0, trained.stderr
    summary = json.loads(trained.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["pairs_left_out_per_epoch"] == 0
    assert "left out" not in trained.stderr  # 16 pairs fill two batches of 8
    assert (model / "encoder.json").is_file()

    result = _retriever(
        "evaluate",
        "--encoder",
        model,
        "--corpus",
        corpus,
        "--queries",
        test,
        "--index",
        "scann-bf",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["index"] == "scann-bf"

    index = tmp_path / "index"
    built = _retriever(
        "index", "build", "--encoder", model, "--corpus", corpus, "--out", index, "--kind", "scann"
    )
    assert built.returncode == 0, built.stderr
    first = json.loads(corpus.read_text().splitlines()[0])
    found = _retriever(
        "index", "query", "--index", index, "--query", first["text"][:200], "--k", "3", "--json"
    )
    assert found.returncode == 0, found.stderr
    [hits] = json.loads(found.stdout)
    assert len(hits["results"]) == 3
    assert hits["results"][0]["doc_id"] == first["doc_id"]  # a document retrieves itself
    shown = _retriever(
        "index", "query", "--index", index, "--query", first["text"][:200], "--k", "1",
        "--corpus", corpus,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    snippet = " ".join(first["text"].split())[:40]
    assert first["doc_id"] in shown.stdout and snippet in shown.stdout  # the text beside the id


def test_errors_are_one_line(tmp_path):
    result = _retriever(
        "evaluate",
        "--encoder",
        tmp_path / "missing",
        "--corpus",
        tmp_path / "c.jsonl",
        "--queries",
        tmp_path / "q.jsonl",
    )
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_train_dp_keeps_its_secret_state_out_of_the_release(tmp_path):
    data = tmp_path / "data"
    assert _retriever("data", "wiki", "--out", data, "--limit", "60").returncode == 0
    corpus, test = data / "corpus.jsonl", data / "test_queries.jsonl"
    ledger = tmp_path / "private" / "ledger.sqlite"
    common = (
        "train-dp", "--queries", data / "train_queries.jsonl", "--corpus", corpus,
        "--encoder", "random:bert", "--epochs", "1", "--batch-size", "16",
        "--ledger", ledger, "--seed", "3",
    )  # fmt: skip
    inside = _retriever(*common, "--out", tmp_path / "a", "--work-dir", tmp_path / "a" / "work")
    assert inside.returncode == 2 and "must not overlap" in inside.stderr, inside.stderr
    assert not ledger.exists()  # refused before the ledger saw the pairs
    kept = tmp_path / "kept-work"
    result = _retriever(*common, "--out", tmp_path / "a", "--dataset", "a", "--work-dir", kept,
                        "--keep-work")  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["work_dir"] == str(kept) and (kept / "charge.json").is_file()
    assert not (tmp_path / "a" / "checkpoints").exists()

    # the same pairs under a second name: refused, then deliberately added up
    refused = _retriever(*common, "--out", tmp_path / "b", "--dataset", "b")
    assert refused.returncode == 1 and "--guarantees-add-up" in refused.stderr
    result = _retriever(*common, "--out", tmp_path / "b", "--dataset", "b", "--guarantees-add-up")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert "work_dir" not in summary  # the default work folder, beside the ledger, is gone
    assert not any((tmp_path / "private" / "work").glob("*"))
    release = tmp_path / "b"
    assert sorted(p.name for p in release.iterdir()) == sorted(
        ["encoder.json", "params.msgpack", "provenance.json", "doc_tower"]
    )
    assert "seconds" not in (release / "encoder.json").read_text()
    assert "fixed seed" in json.loads((release / "provenance.json").read_text())["statement"]
    shipped = tmp_path / "shipped"  # the release folder alone evaluates
    shutil.copytree(release, shipped)
    shutil.rmtree(release)
    result = _retriever(
        "evaluate", "--encoder", shipped, "--corpus", corpus, "--queries", test, "--json"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["num_queries"] == 12
