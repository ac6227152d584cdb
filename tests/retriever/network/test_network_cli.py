"""The command lines end to end: `retriever network query` against real contributors,
`retriever contributor key add` and `card`, and their one-line errors."""

from __future__ import annotations

import json

import httpx
import pytest

from retriever.network.folder import read_card
from retriever.network.local import load_answer_lm, local_answer
from tests.dpsynth.service.harness import bearer
from tests.retriever.network.harness import (
    CARD_EPSILON,
    ENCODER,
    cli,
    free_port_url,
    questions,
    write_keys,
)

TRIO = ("north", "south", "east")


@pytest.fixture(scope="module")
def keys_file(network, tmp_path_factory):
    keys = {network.url(n): network.keys[n] for n in TRIO}
    return write_keys(tmp_path_factory.mktemp("keys") / "keys.json", keys)


def _query(network, keys_file, names, *extra, check=True):
    urls = ",".join(network.url(n) if n in network.servers else n for n in names)
    question = questions(network.world)[2]
    result = cli("network", "query", "--contributors", urls, "--keys", keys_file,
                 "--question", question, *extra, check=check)  # fmt: skip
    return result, question


def _no_secrets(network, *texts: str) -> None:
    secrets = [key.split("_", 2)[2] for key in network.keys.values()]
    assert not any(s in text for s in secrets for text in texts)


def test_query_returns_merged_documents_and_each_guarantee(network, keys_file):
    result, _ = _query(network, keys_file, TRIO, "--k", "4", "--lm", "none")
    body = json.loads(result.stdout)
    assert body["ok"] == 3 and body["failed"] == 0 and result.stderr == ""
    assert [c["url"] for c in body["contributors"]] == [network.url(n) for n in TRIO]
    for report in body["contributors"]:
        assert report["status"] == "ok" and report["hits"] == 4 and report["epsilon"] == 0.0
        assert report["guarantee"]["epsilon"] == CARD_EPSILON  # fetched from /card
    documents = body["documents"]
    assert len(documents) == 4 and body["answer"] is None
    by_url = {network.url(n): network.folders[n].synthetic() for n in TRIO}
    for doc in documents:  # each tagged with the contributor whose release holds it
        assert by_url[doc["contributor"]][doc["doc_id"]] == doc["text"]
    scores = [d["score"] for d in documents]
    assert scores == sorted(scores, reverse=True)
    _no_secrets(network, result.stdout, result.stderr)


@pytest.mark.slow
def test_query_with_rerank_and_a_tiny_local_lm(network, keys_file):
    result, question = _query(
        network, keys_file, TRIO, "--k", "3", "--lm", "tiny", "--rerank", ENCODER
    )
    body = json.loads(result.stdout)
    assert body["ok"] == 3 and body["reranked_by"] == ENCODER and body["answered_by"] == "tiny"
    lm, prompt = load_answer_lm("tiny")
    texts = [d["text"] for d in body["documents"]]
    expected = local_answer(lm, prompt, question, texts, max_tokens=32, max_document_tokens=160)
    assert body["answer"] == expected


def test_partial_results_exit_zero_and_warn(network, keys_file, tmp_path):
    down = free_port_url()
    keys = write_keys(tmp_path / "keys.json", {**json.loads(keys_file.read_text()),
                                               down: "dpk_unused"})  # fmt: skip
    result, _ = _query(network, keys, ("north", down), "--timeout", "5", "--retries", "1")
    body = json.loads(result.stdout)
    north, dead = body["contributors"]
    assert north["status"] == "ok" and dead["status"] == "error" and dead["url"] == down
    assert {d["contributor"] for d in body["documents"]} == {network.url("north")}
    assert f"warning: {down}: error: connection failed (ConnectError)" in result.stderr


def test_every_contributor_failing_exits_non_zero(network, tmp_path):
    down = free_port_url()
    keys = write_keys(tmp_path / "keys.json", {down: "dpk_unused"})
    result, _ = _query(network, keys, (down,), "--retries", "0", check=False)
    assert result.returncode == 1
    assert json.loads(result.stdout)["failed"] == 1
    assert result.stderr.strip().splitlines()[-1] == "error: all 1 contributors failed"


@pytest.mark.parametrize(
    ("keys_text", "message"),
    [
        ("{}", "has no key for"),
        ("not json", "is not JSON"),
        ('["a list"]', "must be a JSON object"),
    ],
)
def test_bad_keys_files_are_one_line_errors(network, tmp_path, keys_text, message):
    keys = tmp_path / "keys.json"
    keys.write_text(keys_text)
    result, _ = _query(network, keys, ("north",), check=False)
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and message in line


def test_key_add_prints_a_key_that_authenticates_there_only(network):
    folders = network.folders["south"]
    added = cli("contributor", "key", "add", "carol", "--work", folders.work,
                "--epsilon", "1.0", "--delta", "1e-6")  # fmt: skip
    key = added.stdout.strip()
    assert key.startswith("dpk_") and len(key.splitlines()) == 1
    assert key.split("_", 2)[2].encode() not in folders.ledger.read_bytes()  # stored hashed
    ask = {"question": "fever", "k": 2}
    at_south = httpx.post(
        network.url("south") + "/retrieve", headers=bearer(key), json=ask, timeout=30
    )
    assert at_south.status_code == 200 and len(at_south.json()["results"]) == 2
    at_east = httpx.post(
        network.url("east") + "/retrieve", headers=bearer(key), json=ask, timeout=30
    )
    assert at_east.status_code == 401
    again = cli("contributor", "key", "add", "carol", "--work", folders.work,
                "--epsilon", "1.0", "--delta", "1e-6", check=False)  # fmt: skip
    assert again.returncode == 1 and again.stderr.startswith("error: tenant carol exists")


def test_card_and_serve_arguments(network, tmp_path):
    release = network.folders["east"].release
    printed = cli("contributor", "card", "--dir", release)
    assert json.loads(printed.stdout) == read_card(release)
    missing = cli("contributor", "card", "--dir", tmp_path, check=False)
    assert missing.returncode == 1 and "no card.json" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    no_work = cli("contributor", "serve", "--dir", release, check=False)
    assert no_work.returncode != 0 and "--work" in no_work.stderr
