"""`retriever knowledge release|answer` and `retriever serve --knowledge`, as a user runs them.

A medical world written by `python -m retriever.rag.medical`, released once in cluster
mode (tiny LM, fixed seed), then answered from the CLI and from a real server on a loopback
port: every answer says it charged nothing, and the ledger holds the one release charge
whatever is asked.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from synthgen.privacy import PrivacyLedger
from tests.retriever.service.harness import Server, cli

pytestmark = pytest.mark.slow
EPSILON = 10.0


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    root = tmp_path_factory.mktemp("knowledge")
    subprocess.run(
        [sys.executable, "-m", "retriever.rag.medical", "--out", root / "world",
         "--num-records", "200", "--num-diseases", "5"],
        check=True, capture_output=True,
    )  # fmt: skip
    corpus, ledger = root / "world" / "corpus.jsonl", root / "ledger.sqlite"
    result = cli("knowledge", "release", "--private-corpus", corpus, "--out", root / "release",
                 "--epsilon", EPSILON, "--ledger", ledger, "--work", root / "work",
                 "--mode", "clusters", "--fields", "Diagnosis,Symptoms,Treatment",
                 "--field-values", "1,2,1", "--lm", "tiny", "--voters", 4,
                 "--public-pool-size", 8, "--max-clusters", 6,
                 "--seed", 0, "--json")  # fmt: skip
    return {"root": root, "corpus": corpus, "ledger": ledger, "line": result.stdout}


def test_release_prints_its_guarantee_as_one_json_line(released):
    lines = released["line"].strip().splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert line["complete"] and line["synthetic_records"] > 0
    assert 0 < line["epsilon"] <= EPSILON and line["delta"] == 1e-6
    charges = PrivacyLedger(released["ledger"]).charges("release", "corpus")
    assert [c.stage for c in charges] == ["knowledge-release"]


def test_labels_say_what_they_count(released):
    line = json.loads(released["line"])
    assert "documents" not in line and line["synthetic_records"] > 0
    if line["epsilon"] < EPSILON:  # the composition lands under the request: said why
        assert line["epsilon_requested"] == EPSILON and "composition" in line["epsilon_note"]
    card = json.loads((released["root"] / "release" / "card.json").read_text())
    assert "the private collection 'corpus'" in card["statement"]
    assert "Diagnosis, Symptoms, Treatment" in card["releases"]["generator"]
    assert "few-shot" not in card["releases"]["generator"]


def test_releasing_twice_is_refused_with_one_line(released):
    root = released["root"]
    result = cli("knowledge", "release", "--private-corpus", released["corpus"],
                 "--out", root / "again", "--epsilon", EPSILON, "--ledger", released["ledger"],
                 "--work", root / "work2", "--mode", "clusters", "--lm", "tiny",
                 check=False)  # fmt: skip
    assert result.returncode != 0
    assert "already released" in result.stderr and "Traceback" not in result.stderr
    assert not (root / "again").exists()


def test_answer_charges_nothing_and_abstains_on_what_the_release_does_not_hold(released):
    from retriever.knowledge_base import KnowledgeBase
    from retriever.lexical import QUESTION_WORDS, words

    base = KnowledgeBase.open(released["root"] / "release", lm="tiny", k=1)
    held = words(next(iter(base.records.values())))
    word = min(w for w in held if len(w) >= 5 and w not in QUESTION_WORDS)  # the release's
    result = cli("knowledge", "answer", "--knowledge", released["root"] / "release",
                 "--question", f"Which disease causes {word}?", "--lm", "tiny",
                 "--json")  # fmt: skip
    answer = json.loads(result.stdout)
    assert answer["charged"] is False and answer["epsilon_spent"] == 0.0
    assert answer["guarantee"]["epsilon"] <= EPSILON and answer["sources"]
    assert not answer["abstained"] and answer["records"]
    unrelated = json.loads(
        cli(
            "knowledge",
            "answer",
            "--knowledge",
            released["root"] / "release",
            "--question",
            "Qzxv wrplk?",
            "--lm",
            "tiny",
            "--json",
        ).stdout  # fmt: skip
    )
    assert unrelated["abstained"] and unrelated["sources"] == []
    assert "post-processing" in answer["statement"]
    assert len(PrivacyLedger(released["ledger"]).charges("release", "corpus")) == 1


def test_bm25_finds_the_record_that_holds_the_questions_word_and_dense_still_answers(released):
    from retriever.knowledge_base import KnowledgeBase
    from retriever.lexical import words

    folder = released["root"] / "release"
    base = KnowledgeBase.open(folder, lm="tiny", k=1)
    assert base.retrieval == "bm25"
    texts = list(base.records.values())
    counts = {w: sum(w in words(t) for t in texts) for t in texts for w in words(t)}
    rare = min(counts, key=lambda w: (counts[w], w))  # a word few records hold
    hit = base.search(f"Which disease causes {rare}?")[0]
    assert rare in words(hit["text"]) and hit["score"] > 0
    result = cli("knowledge", "answer", "--knowledge", folder, "--question", "a rash?",
                 "--lm", "tiny", "--retrieval", "dense", "--json")  # fmt: skip
    assert json.loads(result.stdout)["sources"]
    bad = cli("knowledge", "answer", "--knowledge", folder, "--question", "a rash?",
              "--lm", "tiny", "--retrieval", "fuzzy", check=False)  # fmt: skip
    assert bad.returncode != 0 and "--retrieval" in bad.stderr


class KnowledgeServer(Server):
    """`retriever serve --knowledge DIR` in a child process (the harness's start/stop)."""

    def __init__(self, release, log):  # no private index, corpus or ledger to pass
        self.args = [sys.executable, "-m", "retriever.cli", "serve", "--knowledge", release,
                     "--lm", "tiny"]  # fmt: skip
        self.log, self.proc, self.url = log, None, ""


def test_serve_knowledge_answers_for_free(released):
    server = KnowledgeServer(released["root"] / "release", released["root"] / "serve.log")
    server.start()
    try:
        budget = httpx.get(server.url + "/budget", timeout=30).json()
        assert budget["charged_per_answer"] == {"epsilon": 0.0, "delta": 0.0}
        assert "Answers cost nothing" in budget["statement"]
        for question in ("Which disease causes a rash?", "What treats tremor?"):
            reply = httpx.post(server.url + "/answer", json={"question": question}, timeout=60)
            assert reply.status_code == 200 and reply.json()["charged"] is False
        # the same parsing and refusals as `retriever serve` (retriever.service.responses)
        for bad, status, error in (
            ({}, 400, "invalid_question"),
            ({"question": ""}, 400, "empty_question"),
            ({"question": "x" * 3000}, 413, "question_too_long"),
            ({"question": 3}, 400, "invalid_question"),
            ({"question": "What treats tremor?", "k": 3}, 400, "unknown_fields"),
        ):
            reply = httpx.post(server.url + "/answer", json=bad, timeout=30)
            assert (reply.status_code, reply.json()["error"]) == (status, error), reply.text
        assert reply.json()["fields"] == ["k"] and "k" in reply.json()["detail"]
        # curl -d sends application/x-www-form-urlencoded: a JSON body is still read
        form = httpx.post(
            server.url + "/answer",
            content=b'{"question": "What treats tremor?"}',
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            timeout=60,
        )
        assert form.status_code == 200 and form.json()["charged"] is False
        page = httpx.get(server.url + "/", timeout=30).text
        assert "Answers cost nothing" in page
    finally:
        server.stop()
    assert len(PrivacyLedger(released["ledger"]).charges("release", "corpus")) == 1
