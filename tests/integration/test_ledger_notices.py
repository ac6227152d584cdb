"""Every command that charges a ledger names it on stderr, warns when it created a new
ledger file, and warns about a weak guarantee (epsilon above 10, delta near 1/n) without
refusing it (privacy review, issue 68, findings 12 and 15).

The commands that train or generate are run in-process with their heavy step replaced by
one that stops them: the notices are printed before any compute, which is all these tests
read. `retriever answer`, `generate-docs` and `knowledge release` run whole as a user runs
them (test LM).
"""

import json
import sys

import cli_process
import numpy as np
import pytest

N = 20  # documents of the collection below


def _run(*args):
    return cli_process.run([sys.executable, "-m", *map(str, args)], capture_output=True, text=True)


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning: ")]


def _weak(err: str) -> list[str]:
    return [w for w in _warnings(err) if w.startswith(("warning: epsilon=", "warning: delta="))]


class _Stop(Exception):
    """Raised by a replaced heavy step: the command got past its ledger."""


def _stop(*args, **kwargs):
    raise _Stop("stopped before compute")


@pytest.fixture
def collection(tmp_path):
    """An exact index over N documents and its corpus (term-overlap retrieval needs no
    encoder)."""
    from retriever.index import ExactSearcher
    from retriever.index_folder import save_index_folder

    ids = [f"d{i}" for i in range(N)]
    corpus = tmp_path / "records.jsonl"
    corpus.write_text("".join(json.dumps({"doc_id": d, "text": f"{d} blue"}) + "\n" for d in ids))
    index = tmp_path / "index"
    save_index_folder(
        index, ExactSearcher(np.eye(N, 32, dtype=np.float32)), encoder="all-minilm-l6-v2",
        doc_ids=ids,
    )  # fmt: skip
    return index, corpus


def _answer(collection, ledger, *extra):
    index, corpus = collection
    return _run(
        "dpsynth.cli.retriever", "answer", "--index", index, "--private-corpus", corpus,
        "--question", "which record says blue?", "--ledger", ledger, "--dataset", "records",
        "--tenant", "alice", "--lm", "tiny", "--retrieval", "overlap", "--json", *extra,
    )  # fmt: skip


def test_answer_names_its_ledger_and_warns_once_when_it_created_it(collection, tmp_path):
    ledger = tmp_path / "new" / "ledger.sqlite"
    ordinary = ("--epsilon", "1", "--tenant-epsilon", "5", "--collection-epsilon", "10",
                "--collection-delta", "1e-5")  # fmt: skip
    first = _answer(collection, ledger, *ordinary)
    assert first.returncode == 0, first.stderr
    location = f"ledger: collection records is charged in {ledger.resolve()}"
    assert location in first.stderr.splitlines()
    [created] = _warnings(first.stderr)
    assert created.startswith(f"warning: created a new ledger at {ledger.resolve()}")
    assert "records starts with a full budget here" in created and "--ledger OLD" in created
    again = _answer(collection, ledger, *ordinary)  # the same ledger: named, no warning
    assert again.returncode == 0, again.stderr
    assert location in again.stderr.splitlines() and _warnings(again.stderr) == []
    json.loads(again.stdout.strip().splitlines()[-1])  # stdout is still the JSON alone


def test_answer_warns_about_a_weak_guarantee_and_still_answers(collection, tmp_path):
    result = _answer(
        collection, tmp_path / "l.sqlite", "--epsilon", "12", "--delta", "0.01",
        "--tenant-epsilon", "20", "--tenant-delta", "0.02", "--collection-epsilon", "30",
        "--collection-delta", "0.02",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert [w.split(" is ")[0] for w in _weak(result.stderr)] == [
        "warning: epsilon=12 (per answer)",
        "warning: delta=0.01 (per answer)",
        "warning: epsilon=30 (collection cap)",
        "warning: delta=0.02 (collection cap)",
    ]
    assert f"near 1/n (n={N})" in result.stderr and "<= 1/(10 n) = 0.005" in result.stderr


def test_serve_names_its_ledger_and_warns_about_a_weak_collection_cap(
    collection, tmp_path, monkeypatch, capsys
):
    import dpsynth.service.server
    from dpsynth.cli.retriever import app
    from synthgen.command_line import run

    index, corpus = collection
    ledger = tmp_path / "ledger.sqlite"
    assert run(app, ["tenant", "add", "alice", "--epsilon", "5", "--delta", "1e-5",
                     "--ledger", str(ledger), "--dataset", "records",
                     "--collection-epsilon", "20", "--collection-delta", "1e-5"]) == 0  # fmt: skip
    capsys.readouterr()
    served = []
    monkeypatch.setattr(dpsynth.service.server, "serve", lambda s, **kw: served.append(s))
    code = run(app, ["serve", "--index", str(index), "--private-corpus", str(corpus),
                     "--ledger", str(ledger), "--dataset", "records", "--lm", "tiny",
                     "--retrieval", "overlap", "--mechanism", "icl"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0 and len(served) == 1, err
    assert f"ledger: collection records is charged in {ledger.resolve()}" in err
    assert "created a new ledger" not in err  # `tenant add` made it
    [weak] = _weak(err)  # the per-answer (1, 1e-6) is ordinary
    assert weak.startswith("warning: epsilon=20 (collection cap) is above 10")


def test_generate_docs_warns_about_a_weak_guarantee_only(tmp_path):
    private = tmp_path / "private.jsonl"
    rows = [{"body": "abab abab", "topic": "x"}] * 60 + [{"body": "cdcd", "topic": "y"}] * 60
    private.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ledger = tmp_path / "ledger.sqlite"

    def generate(out, *extra):
        return _run(
            "dpsynth.cli.synthgen", "generate-docs", "--private", private, "--text-field", "body",
            "--label-field", "topic", "--labels", "x,y", "--public-pool-size", 50,
            "--num-examples", 2, "--subsets", 5, "--shots", 2, "--max-new-tokens", 4,
            "--model", "tiny", "--ledger", ledger, "--out", tmp_path / out, *extra,
        )  # fmt: skip

    ordinary = generate("a", "--epsilon", 8, "--dataset", "a")  # default delta 1/(10 N)
    assert ordinary.returncode == 0, ordinary.stderr
    assert f"ledger: collection a is charged in {ledger.resolve()}" in ordinary.stderr
    assert [w[:30] for w in _warnings(ordinary.stderr)] == ["warning: created a new ledger "]
    # N = 50 declared per label x 2 labels = 100: delta 0.005 is near 1/N
    weak = generate("b", "--epsilon", 12, "--delta", 0.005, "--dataset", "b",
                    "--guarantees-add-up")  # fmt: skip
    assert weak.returncode == 0, weak.stderr
    # the plan's epsilon is calibrated just below the target
    assert [w.split("=")[0] for w in _warnings(weak.stderr)] == [
        "warning: epsilon",
        "warning: delta",
    ]
    assert " is above 10: the guarantee is weak" in weak.stderr
    assert "warning: delta=0.005 is near 1/n (n=100)" in weak.stderr


def test_knowledge_release_names_its_ledger_and_warns(tmp_path):
    from dpsynth.evaluation.fact_world import make_world, write_world

    write_world(make_world("products", facts_per_level=2, seed=5), tmp_path / "world")
    ledger = tmp_path / "ledger.sqlite"
    result = _run(
        "dpsynth.cli.retriever", "knowledge", "release", "--private-corpus",
        tmp_path / "world" / "corpus.jsonl", "--ledger", ledger, "--work", tmp_path / "work",
        "--out", tmp_path / "release", "--epsilon", 12, "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"ledger: collection corpus is charged in {ledger.resolve()}" in result.stderr
    assert "warning: created a new ledger" in result.stderr
    [weak] = _weak(result.stderr)  # the default delta 1e-6 is far below 1/n
    assert weak.startswith("warning: epsilon=12 is above 10")


# ---- the training and generation commands, stopped after their ledger -----------------


@pytest.fixture
def pairs(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [
        {"document": f"document {i}", "query": f"query {i}", "doc_id": str(i)} for i in range(40)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _synthgen(argv, capsys):
    from dpsynth.cli.synthgen import app
    from synthgen.command_line import run

    code = run(app, list(map(str, argv)))
    err = capsys.readouterr().err
    assert code == 1 and "stopped before compute" in err, err
    return err


def test_train_generator_names_its_ledger_and_warns(pairs, tmp_path, monkeypatch, capsys):
    from synthgen import querygen

    monkeypatch.setattr(querygen, "train_generator", _stop)
    ledger = tmp_path / "ledger.sqlite"
    base = ["train-generator", "--pairs", pairs, "--ledger", ledger, "--batch-size", 8,
            "--epochs", 1]  # fmt: skip
    err = _synthgen([*base, "--out", tmp_path / "a", "--epsilon", 4, "--delta", 1e-3,
                     "--dataset", "a"], capsys)  # fmt: skip
    assert f"ledger: collection a is charged in {ledger.resolve()}" in err
    assert "warning: created a new ledger" in err and _weak(err) == []
    err = _synthgen([*base, "--out", tmp_path / "b", "--epsilon", 12, "--dataset", "b",
                     "--guarantees-add-up"], capsys)  # fmt: skip
    assert "created a new ledger" not in err
    # n = 40 pairs; the default delta 1/(2n) is near 1/n
    assert [w.split("=")[0] for w in _weak(err)] == ["warning: epsilon", "warning: delta"]
    assert " is above 10: the guarantee is weak" in err
    assert "warning: delta=0.0125 is near 1/n (n=40)" in err


def test_train_dp_names_its_ledger_and_warns(pairs, tmp_path, monkeypatch, capsys):
    import retriever.encoders
    import retriever.train
    from dpsynth.cli.retriever import app
    from synthgen.command_line import run

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"doc_id": str(i), "text": f"document {i}"}) + "\n"
                              for i in range(40)))  # fmt: skip
    monkeypatch.setattr(retriever.encoders, "load_encoder", lambda name: None)
    monkeypatch.setattr(retriever.train, "train_retriever_dp", _stop)
    ledger = tmp_path / "ledger.sqlite"
    code = run(app, list(map(str, [
        "train-dp", "--queries", pairs, "--corpus", corpus, "--out", tmp_path / "out",
        "--ledger", ledger, "--epsilon", 20, "--delta", 1e-3, "--batch-size", 8,
    ])))  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and "stopped before compute" in err, err
    assert f"ledger: collection pairs is charged in {ledger.resolve()}" in err
    assert "warning: created a new ledger" in err
    [weak] = _weak(err)  # delta 1e-3 <= 1/(10 x 40)
    assert weak.startswith("warning: epsilon=") and " is above 10" in weak  # about 20


def test_generate_docs_pe_names_its_ledger_and_warns(tmp_path, monkeypatch, capsys):
    from synthgen import lm_backends

    private = tmp_path / "private.jsonl"
    private.write_text("".join(json.dumps({"text": f"sample {i}"}) + "\n" for i in range(10)))
    monkeypatch.setattr(lm_backends, "load_backend", _stop)
    ledger = tmp_path / "ledger.sqlite"
    err = _synthgen(["generate-docs-pe", "--private", private, "--text-field", "text",
                     "--num-samples", 4, "--out", tmp_path / "out", "--model", "tiny",
                     "--ledger", ledger, "--epsilon", 4, "--public-size", 100,
                     "--delta", 0.002], capsys)  # fmt: skip
    assert f"ledger: collection private is charged in {ledger.resolve()}" in err
    assert "warning: created a new ledger" in err
    [weak] = _weak(err)  # N = 100 declared: delta 0.002 is near 1/N
    assert weak.startswith("warning: delta=0.002 is near 1/n (n=100)")
