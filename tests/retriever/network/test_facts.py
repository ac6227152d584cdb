"""The network over contributors' fact releases: `retriever contributor build` (facts, the
default), `retriever contributor serve` over the release, and the engine's fact answers
(`retriever.network.facts`) against the same answerer over the whole releases."""

from __future__ import annotations

import json

import pytest

from dpsynth.evaluation.fact_world import make_world
from dpsynth.service.contributor import add_key
from retriever.fact_answers import ABSTAIN
from retriever.network.engine import Contributor, EngineConfig, NetworkQueryEngine
from retriever.network.facts import (
    fact_answer,
    is_fact_card,
    merge_fact_records,
    parse_fact_record,
)
from retriever.network.folder import read_card
from retriever.network.local import load_answer_lm
from tests.dpsynth.service.harness import cli
from tests.retriever.network.harness import (
    ContributorServer,
    Folders,
    free_port_url,
    start_all,
)

PARTS = 2


def test_parse_fact_record_reads_what_a_fact_release_writes():
    record = parse_fact_record("Dara Quill: Velmora Dynamics; 1970.")
    assert record == {
        "topic": "Dara Quill",
        "partners": ["Velmora Dynamics", "1970"],
        "text": "Dara Quill: Velmora Dynamics; 1970.",
    }
    for text in ("Patients with marsh fever report a high temperature.", "A: b", "A: b; .", ""):
        assert parse_fact_record(text) is None


def test_merge_unions_partners_by_rank_and_lends_topics():
    merged = merge_fact_records(
        [
            ["Dara Quill: Velmora Dynamics; 1970.", "a plain document."],
            ["Dara Quill: Poswick; Velmora Dynamics.", "Liton: Kel Varo."],
        ]
    )
    by_topic = {r["topic"]: r for r in merged}
    assert by_topic["Dara Quill"]["partners"] == ["Velmora Dynamics", "Poswick", "1970"]
    assert by_topic["Dara Quill"]["text"] == "Dara Quill: Velmora Dynamics; Poswick; 1970."
    # a pair is one fact: Kel Varo's record was not fetched, Liton's names it
    assert by_topic["Kel Varo"]["partners"] == ["Liton"]
    assert by_topic["Velmora Dynamics"]["partners"] == ["Dara Quill"]
    assert merge_fact_records([["no record here."]]) == []


@pytest.fixture(scope="module")
def fact_network(tmp_path_factory):
    """Two contributors, each a fact release of half a small fact world (`contributor
    build`, default mode), served by `retriever contributor serve`."""
    root = tmp_path_factory.mktemp("fact-network")
    world = make_world("people", facts_per_level=3, levels=(30,), filler_share=0.1, seed=0)
    folders, keys, lines = [], [], []
    for c in range(PARTS):
        corpus = root / f"c{c}" / "private.jsonl"
        corpus.parent.mkdir()
        corpus.write_text("".join(json.dumps({"doc_id": f"{c}-{i}", "text": t}) + "\n"
                                  for i, t in enumerate(world.documents[c::PARTS])))  # fmt: skip
        release, work = root / f"c{c}" / "release", root / f"c{c}" / "work"
        result = cli("contributor", "build", "--private", corpus, "--epsilon", 10,
                     "--out", release, "--work", work, "--no-answer-index")  # fmt: skip
        lines.append(json.loads(result.stdout.strip().splitlines()[-1]))
        folders.append(Folders(f"c{c}", release, work))
        keys.append(add_key(work, "client", epsilon=1.0, delta=1e-6,
                            collection_epsilon=1.0, collection_delta=1e-6))  # fmt: skip
    servers = [ContributorServer(f, root / f"{f.name}.log") for f in folders]
    start_all(servers)
    yield world, folders, servers, keys, lines
    for server in servers:
        server.stop()


def _engine(servers, keys, lm, prompt, extra=()) -> NetworkQueryEngine:
    contributors = [Contributor(s.url, k, f"c{c}") for c, (s, k) in enumerate(zip(servers, keys))]
    return NetworkQueryEngine(
        [*contributors, *extra], config=EngineConfig(k=4, timeout=30), lm=lm, prompt=prompt,
        lm_name="tiny",
    )  # fmt: skip


def test_contributor_build_releases_facts_by_default(fact_network):
    _, folders, _, _, lines = fact_network
    for folder, line in zip(folders, lines):
        assert line["pairs"] > 0 and line["synthetic_records"] > 0 and line["epsilon"] == 10
        card = read_card(folder.release)
        assert is_fact_card(card) and card["guarantee"]["delta"] == 1e-6
        assert (folder.release / "facts.json").is_file()


def test_engine_answers_from_fact_releases_as_one_release_would(fact_network):
    world, folders, servers, keys, _ = fact_network
    lm, prompt = load_answer_lm("tiny")
    engine = _engine(servers, keys, lm, prompt)
    whole = [list(folder.synthetic().values()) for folder in folders]
    sigma = max(read_card(f.release)["guarantee"]["stages"][0]["noise_stddev"] for f in folders)
    for q in world.questions:
        response = engine.query_sync(q.question)
        assert [r.status for r in response.contributors] == ["ok"] * PARTS
        assert all(r.guarantee["epsilon"] == 10 for r in response.contributors)  # cards read
        assert not response.abstained
        # the same answer as the typed answerer over every record of every release
        assert response.answer == fact_answer(lm, q.question, whole, sigma)[0] == q.answer
        subject = next(f.subject for f in world.facts if f.value == q.answer)
        assert response.records and response.records[0].startswith(f"{subject}: ")
        assert q.answer in response.records[0]  # the merged record holds the true value
        assert len(response.documents) <= 4  # the merged documents are still the top k


def test_engine_abstains_when_the_question_names_no_released_phrase(fact_network):
    _, _, servers, keys, _ = fact_network
    lm, prompt = load_answer_lm("tiny")
    # one contributor down: the others' releases still answer (or abstain)
    engine = _engine(servers, keys, lm, prompt, extra=[Contributor(free_port_url(), "k", "gone")])
    response = engine.query_sync("Which company does Quorbin Halvex work for?")
    assert response.abstained and response.answer == ABSTAIN and response.records == []
    assert [r.status for r in response.contributors] == ["ok"] * PARTS + ["error"]


def test_a_release_folder_gets_its_card_last(tmp_path, monkeypatch):
    """A crash before the card leaves no folder a reader takes for a release: facts.json
    (which makes a folder a fact release) is written before card.json."""
    from pathlib import Path

    from retriever.network.folder import make_card, write_knowledge_folder

    written = []
    write_text = Path.write_text

    def recording(self, *args, **kwargs):
        written.append(self.name)
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", recording)
    card = make_card(
        contributor="c", epsilon=1.0, delta=1e-6, generator="test", model="none",
        encoder="all-minilm-l6-v2", num_documents=0, seeded=True,
    )  # fmt: skip
    write_knowledge_folder(tmp_path / "release", [], [], card, extra={"facts.json": "{}"})
    assert written[-2:] == ["facts.json", "card.json"]
