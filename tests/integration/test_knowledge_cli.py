"""A cluster release folder (retired release) stays answerable: `retriever knowledge answer`
and `retriever serve --knowledge`, as a user runs them.

The cluster release (DP-SynRAG, `--mode clusters`) was retired; folders it released are
still read. The folder here is written by hand the way that release wrote it (records of
fields and keywords, no facts.json, a card with its three stages), then answered from the
CLI and from a real server on a loopback port: every answer says it charged nothing.
"""

from __future__ import annotations

import json
import sys

import httpx
import pytest

from tests.dpsynth.service.harness import Server, cli

pytestmark = pytest.mark.slow
EPSILON = 9.2  # the card's composed epsilon (a cluster release stated it below the request)
RECORDS = (
    ("quinaxitis", "Diagnosis: Quinaxitis\nSymptoms: Shivers, Blisters\nTreatment: Dabaxozane\n"
     "Keywords: quinaxitis, shivers, blisters"),
    ("bruvelosis", "Diagnosis: Bruvelosis\nSymptoms: Wheezing, Cramps\nTreatment: Plunexozane\n"
     "Keywords: bruvelosis, wheezing, cramps"),
    ("tremadoria", "Diagnosis: Tremadoria\nSymptoms: Itching, Swelling\nTreatment: Fusonivir\n"
     "Keywords: tremadoria, itching, swelling"),
)  # fmt: skip
GENERATOR = (
    "DP-SynRAG-style (Mori et al. 2025): DP keywords (PipelineDP partition selection), soft "
    "clusters, one record per cluster whose fields (Diagnosis, Symptoms, Treatment) are each "
    "one DP vote over the cluster's released keywords"
)


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    from retriever.network.folder import CARD_FORMAT, RELATION, write_knowledge_folder

    root = tmp_path_factory.mktemp("knowledge")
    stages = [
        {"stage": stage, "epsilon": EPSILON / 3, "delta": 1e-6 / 3}
        for stage in ("keywords", "cluster-keywords", "generation")
    ]
    card = {  # as the cluster release wrote it (retriever.network.folder.make_card)
        "format": CARD_FORMAT,
        "contributor": "corpus",
        "created": "2025-11-01",
        "releases": {
            "synthetic_documents": len(RECORDS),
            "generator": GENERATOR,
            "model": "smollm2-135m-instruct",
            "encoder": "all-minilm-l6-v2",
        },
        "guarantee": {
            "epsilon": EPSILON,
            "delta": 1e-6,
            "privacy_unit": "one document of the private collection 'corpus'",
            "neighboring_relation": RELATION,
            "stages": stages,
            "seeded": False,
        },
        "statement": f"({EPSILON}, 1e-06)-DP for one document of the private collection "
        "'corpus' (add/remove one document): the synthetic documents, their topics and this "
        "index are the only things released; retrieving from them is post-processing and "
        "spends no budget, however many questions are asked",
    }
    write_knowledge_folder(
        root / "release",
        [text for _, text in RECORDS],
        [topic for topic, _ in RECORDS],
        card,
        metadata={"generation": {"method": GENERATOR, "clusters": len(RECORDS)}},
    )
    return {"root": root, "release": root / "release"}


def _ask(folder, question, *extra):
    result = cli("knowledge", "answer", "--knowledge", folder, "--question", question,
                 "--lm", "tiny", "--json", *extra)  # fmt: skip
    return json.loads(result.stdout)


def test_answer_charges_nothing_and_abstains_on_what_the_release_does_not_hold(released):
    from retriever.knowledge_base import KnowledgeBase

    base = KnowledgeBase.open(released["release"], lm="tiny", k=1)
    assert base.facts is None and len(base.records) == len(RECORDS)  # read as a cluster folder
    answer = _ask(released["release"], "Which disease causes wheezing?")
    assert answer["charged"] is False and answer["epsilon_spent"] == 0.0
    assert answer["guarantee"]["epsilon"] == EPSILON and answer["sources"]
    assert not answer["abstained"] and "Bruvelosis" in answer["records"][0]
    assert "post-processing" in answer["statement"]
    unrelated = _ask(released["release"], "Qzxv wrplk?")
    assert unrelated["abstained"] and unrelated["sources"] == []


def test_bm25_finds_the_record_that_holds_the_questions_word_and_dense_still_answers(released):
    from retriever.knowledge_base import KnowledgeBase
    from retriever.lexical import words

    folder = released["release"]
    base = KnowledgeBase.open(folder, lm="tiny", k=1)
    assert base.retrieval == "bm25"
    hit = base.search("Which disease causes blisters?")[0]
    assert "blisters" in words(hit["text"]) and hit["score"] > 0
    assert _ask(folder, "a rash?", "--retrieval", "dense")["sources"]
    bad = cli("knowledge", "answer", "--knowledge", folder, "--question", "a rash?",
              "--lm", "tiny", "--retrieval", "fuzzy", check=False)  # fmt: skip
    assert bad.returncode != 0 and "--retrieval" in bad.stderr


class KnowledgeServer(Server):
    """`retriever serve --knowledge DIR` in a child process (the harness's start/stop)."""

    def __init__(self, release, log):  # no private index, corpus or ledger to pass
        self.args = [sys.executable, "-m", "dpsynth.cli.retriever", "serve", "--knowledge", release,
                     "--lm", "tiny"]  # fmt: skip
        self.log, self.proc, self.url = log, None, ""


def test_serve_knowledge_answers_for_free(released):
    server = KnowledgeServer(released["release"], released["root"] / "serve.log")
    server.start()
    try:
        budget = httpx.get(server.url + "/budget", timeout=30).json()
        assert budget["charged_per_answer"] == {"epsilon": 0.0, "delta": 0.0}
        assert "Answers cost nothing" in budget["statement"]
        for question in ("Which disease causes itching?", "What treats cramps?"):
            reply = httpx.post(server.url + "/answer", json={"question": question}, timeout=60)
            assert reply.status_code == 200 and reply.json()["charged"] is False
            assert reply.json()["sources"]
        # the same parsing and refusals as `retriever serve` (dpsynth.service.responses)
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
            content=b'{"question": "What treats cramps?"}',
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            timeout=60,
        )
        assert form.status_code == 200 and form.json()["charged"] is False
        page = httpx.get(server.url + "/", timeout=30).text
        assert "Answers cost nothing" in page
    finally:
        server.stop()
