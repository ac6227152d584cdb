"""`retriever knowledge release` (fact mode, the default) as a new user runs it on a fact world.

Plan first (--dry-run: public n, epsilon, delta only), a release that could carry nothing is
refused before any charge, the release is charged once, and its answers name their records,
abstain on what it does not hold, and never hold a fact stated in one document.
"""

from __future__ import annotations

import json
import sys

import httpx
import pytest

from dpsynth.evaluation.fact_world import make_world, write_world
from synthgen.privacy import PrivacyLedger
from tests.dpsynth.service.harness import Server, cli


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("facts")
    fact_world = make_world("products", facts_per_level=2, seed=5)
    write_world(fact_world, root / "world")
    return {"root": root, "corpus": root / "world" / "corpus.jsonl", "world": fact_world}


def _release(world, *extra, check=True):
    root = world["root"]
    return cli("knowledge", "release", "--private-corpus", world["corpus"],
               "--ledger", root / "ledger.sqlite", "--work", root / "work", *extra,
               check=check)  # fmt: skip


def _ask(release, question):
    """`retriever knowledge answer --json` with the test LM, parsed."""
    result = cli("knowledge", "answer", "--knowledge", release, "--question", question,
                 "--lm", "tiny", "--json")  # fmt: skip
    return json.loads(result.stdout)


def test_dry_run_prints_what_a_fact_needs_and_charges_nothing(world):
    result = _release(world, "--out", world["root"] / "dry", "--epsilon", 3, "--dry-run")
    assert "a fact needs" in result.stdout and "records stating a fact" in result.stdout
    line = json.loads(
        _release(
            world, "--out", world["root"] / "dry", "--epsilon", 3, "--dry-run", "--json"
        ).stdout  # fmt: skip
    )
    assert line["records"] == len(world["world"].documents)
    assert line["singleton_release_probability"] <= 1e-6 and line["records_needed_50"] > 1
    assert not (world["root"] / "dry").exists()
    assert not (world["root"] / "ledger.sqlite").exists()


def test_a_release_that_can_carry_nothing_is_refused_before_the_charge(world):
    result = _release(world, "--out", world["root"] / "thin", "--epsilon", 0.05, check=False)
    assert result.returncode == 2 and "refused before any charge" in result.stderr
    assert "Traceback" not in result.stderr and not (world["root"] / "thin").exists()
    bad_delta = _release(world, "--out", world["root"] / "thin", "--epsilon", 10,
                         "--delta", 0.01, check=False)  # fmt: skip
    assert bad_delta.returncode == 2 and "1/n" in bad_delta.stderr


def test_release_answer_abstain_and_serve(world):
    root, facts = world["root"], world["world"]
    line = json.loads(_release(world, "--out", root / "release", "--epsilon", 10, "--json").stdout)
    assert line["complete"] and line["synthetic_records"] > 0 and line["pairs"] > 0
    charges = PrivacyLedger(str(root / "ledger.sqlite")).charges("release", "corpus")
    assert [c.stage for c in charges] == ["knowledge-release"]
    released = (root / "release" / "synthetic.jsonl").read_text()
    assert not any(f.value in released for f in facts.facts if f.support == 1)
    card = json.loads((root / "release" / "card.json").read_text())
    assert card["guarantee"]["singleton_release_probability"] <= 1e-6
    question = next(q for q in facts.questions if q.support == 50)
    answer = _ask(root / "release", question.question)
    assert answer["charged"] is False and not answer["abstained"]
    assert answer["sources"] and answer["records"] and answer["answer"] in released
    assert all(s.startswith("syn-") for s in answer["sources"])  # the records' doc_ids
    unknown = _ask(root / "release", "Who makes the Qqzx Z9?")
    assert unknown["abstained"] and unknown["sources"] == [] and unknown["records"] == []
    server = Server.__new__(Server)
    server.args = [sys.executable, "-m", "dpsynth.cli.retriever", "serve", "--knowledge",
                   root / "release", "--lm", "tiny"]  # fmt: skip
    server.log, server.proc, server.url = root / "serve.log", None, ""
    server.start()
    try:
        reply = httpx.post(server.url + "/answer", json={"question": question.question}, timeout=60)
        assert reply.status_code == 200 and reply.json()["answer"] == answer["answer"]
    finally:
        server.stop()
    assert len(PrivacyLedger(str(root / "ledger.sqlite")).charges("release", "corpus")) == 1


def test_a_second_release_of_the_same_documents_adds_up_only_deliberately(world):
    """The same name is refused (it would compose); another name over the same documents
    is refused too unless --guarantees-add-up, and then the ledger totals both names."""
    root = world["root"]
    ledger = root / "ledger-twice.sqlite"

    def release(out, *extra):
        return cli("knowledge", "release", "--private-corpus", world["corpus"],
                   "--ledger", ledger, "--work", root / f"work-{out}", "--out", root / out,
                   "--epsilon", 5, "--json", *extra, check=False)  # fmt: skip

    assert release("first").returncode == 0
    again = release("again")
    assert again.returncode == 1 and "already released" in again.stderr
    assert "--guarantees-add-up" in again.stderr
    # the name came from the file: another collection in a corpus.jsonl is told to rename
    assert "named by its file: corpus" in again.stderr and "--dataset NAME" in again.stderr
    renamed = release("renamed", "--dataset", "corpus-2")
    assert renamed.returncode == 1 and "--dataset corpus" in renamed.stderr
    assert not (root / "renamed").exists()
    book = PrivacyLedger(str(ledger))
    assert {s.dataset for s in book.scopes()} == {"corpus"}  # nothing opened for the new name
    # one record appended (an append-only collection, re-exported): it shares records
    grown = root / "grown.jsonl"
    extra = json.dumps({"doc_id": "appended-1", "text": "One more note, filed today."})
    grown.write_text(world["corpus"].read_text().rstrip("\n") + "\n" + extra + "\n")
    appended = cli("knowledge", "release", "--private-corpus", grown, "--ledger", ledger,
                   "--work", root / "work-grown", "--out", root / "grown", "--epsilon", 5,
                   check=False)  # fmt: skip
    assert appended.returncode == 1 and "share records with corpus" in appended.stderr
    assert "--dataset corpus" in appended.stderr and not (root / "grown").exists()
    added = release("renamed", "--dataset", "corpus-2", "--guarantees-add-up")
    assert added.returncode == 0, added.stderr
    (group,) = book.document_groups()
    assert group.datasets == ("corpus", "corpus-2")
    assert group.documents == len(world["world"].documents)
    assert group.epsilon > book.spent("release", "corpus").epsilon
