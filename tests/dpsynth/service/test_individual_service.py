"""`retriever serve --accounting individual` as a real uvicorn process: three tenants ask
200 questions each; no document passes its filter, every running loss is rebuilt from the
charge rows, `/budget` states the summary only, and each quota holds its answers' charges.
Plus what `serve` and `tenant add` refuse in individual accounting."""

import json
import sqlite3
import threading
from collections import defaultdict

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from dpsynth.cli.retriever import app
from synthgen.privacy import PrivacyLedger
from synthgen.privacy.document_filters import SUMMARY_KEYS, DocumentFilters
from tests.dpsynth.service.harness import Server, bearer, cli, questions

DOCUMENT_EPSILON, DOCUMENT_DELTA = 3.0, 1e-5
# icl at epsilon 1 over 2 tokens: rho 0.0625 per answer; a document's cap (3, 1e-5) is rho
# 0.224, so each document pays for 3 answers and is then left out
SERVE = (
    "--accounting", "individual", "--mechanism", "icl", "--answer-epsilon", "1",
    "--max-tokens", "2", "--document-epsilon", DOCUMENT_EPSILON,
    "--document-delta", DOCUMENT_DELTA, "--relevance-threshold", "0.4",
    "--share-document-summary",
)  # fmt: skip
QUOTAS = {"t0": 1000.0, "t1": 1000.0, "t2": 25.0}  # t2's quota binds before 200 answers
QUESTIONS_EACH = 200


def _retriever(*args):
    """`retriever ARGS` in this process (no interpreter start); its stdout."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def _add(ledger, name, *extra):
    return _retriever("tenant", "add", name, "--epsilon", QUOTAS.get(name, 1.0), "--delta", 1e-5,
                      "--ledger", ledger, "--dataset", "corpus", *extra).strip()  # fmt: skip


def _ask_all(url, key, asked):
    """One tenant's questions in turn; (status, body) of each."""
    outcomes = []
    with httpx.Client(timeout=60) as http:
        for question in asked:
            response = http.post(url + "/answer", headers=bearer(key), json={"question": question})
            outcomes.append((response.status_code, response.json()))
    return outcomes


@pytest.mark.slow
def test_three_tenants_under_per_document_filters(world, tmp_path):
    ledger = str(tmp_path / "ledger.sqlite")
    # no collection cap: the operator states that the collection uses per-document filters
    keys = {name: _add(ledger, name, "--accounting", "individual") for name in ("t0", "t1")}
    server = Server(world, ledger, tmp_path / "server.log", *SERVE).start()
    try:
        # the filters are in the ledger now: a tenant needs no --accounting flag
        keys["t2"] = _add(ledger, "t2")
        health = httpx.get(server.url + "/health", headers=bearer(keys["t0"])).json()
        assert health["accounting"] == "individual" and health["mechanism"] == "icl"
        assert health["document_epsilon"] == DOCUMENT_EPSILON
        assert health["relevance_threshold"] == 0.4

        pool = questions(world)
        rng = np.random.default_rng(0)
        asked = {name: [pool[i] for i in rng.integers(len(pool), size=QUESTIONS_EACH)]
                 for name in keys}  # fmt: skip
        outcomes: dict[str, list] = {}

        def client(name):
            outcomes[name] = _ask_all(server.url, keys[name], asked[name])

        threads = [threading.Thread(target=client, args=(name,)) for name in keys]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        budgets = {
            name: httpx.get(server.url + "/budget", headers=bearer(key), timeout=30)
            for name, key in keys.items()
        }
    finally:
        server.stop()

    book = PrivacyLedger(ledger)
    filters = DocumentFilters(book.store)
    record = filters.get("corpus")
    cap, answer_rho = record.budget.rho_cap, record.answer_rho
    assert record.answers_per_document == 3
    doc_ids = _doc_ids(world)
    assert record.documents == len(doc_ids) == 40

    # no document past its cap; running losses == the sums of their charge rows
    losses = dict(zip(doc_ids, filters.losses("corpus", doc_ids)))
    recomputed = filters.recompute("corpus")
    assert filters.verify("corpus") == 0
    assert set(recomputed) <= set(doc_ids)
    for doc_id, loss in losses.items():
        assert loss == pytest.approx(recomputed.get(doc_id, 0.0), rel=1e-12, abs=0.0)
        assert recomputed.get(doc_id, 0.0) <= cap * (1 + 1e-12)
        assert loss / answer_rho == pytest.approx(round(loss / answer_rho))  # whole answers
    exhausted = [d for d, loss in losses.items() if loss + answer_rho > cap]
    assert exhausted, "no document reached its cap: the test could not fail"
    assert len(exhausted) < len(doc_ids)  # documents below the threshold never pay

    # every document charge belongs to an answer a tenant got back
    returned = {
        body["answer"]["ref"]: (name, body["answer"])
        for name, outs in outcomes.items()
        for status, body in outs
        if status == 200
    }
    with sqlite3.connect(ledger) as conn:
        charge_refs = {r[0] for r in conn.execute("SELECT DISTINCT ref FROM document_charges")}
    assert charge_refs and charge_refs <= set(returned)

    # /budget: the tenant's quota, the summary with exactly SUMMARY_KEYS, no document id
    summary = filters.summary("corpus")
    assert summary["exhausted"] == len(exhausted)
    for name, response in budgets.items():
        assert response.status_code == 200
        budget = response.json()
        assert budget["accounting"] == "individual"
        assert tuple(budget["documents"]) == SUMMARY_KEYS
        assert budget["documents"] == pytest.approx(summary)
        assert budget["documents"]["max_epsilon"] <= DOCUMENT_EPSILON
        assert not any(doc_id in response.text for doc_id in doc_ids)
        # the quota's spend is its answers' charges, no more and no fewer
        mine = {ref: answer for ref, (owner, answer) in returned.items() if owner == name}
        by_ref = defaultdict(list)
        for charge in book.charges(name, "corpus"):
            by_ref[charge.ref.split("/")[0]].append(charge.epsilon)
        assert set(by_ref) == set(mine)
        for ref, answer in mine.items():
            assert tuple(by_ref[ref]) == pytest.approx(
                tuple(c["epsilon"] for c in answer["charges"])
            )
        spent = book.spent(name, "corpus").epsilon
        assert budget["num_charges"] == sum(map(len, by_ref.values()))
        assert budget["spent_epsilon"] == pytest.approx(spent)
        assert spent <= QUOTAS[name] * (1 + 1e-9)

    statuses = {name: [s for s, _ in outs] for name, outs in outcomes.items()}
    assert statuses["t0"] == statuses["t1"] == [200] * QUESTIONS_EACH
    assert set(statuses["t2"]) == {200, 402} and statuses["t2"][0] == 200  # the quota binds
    assert {b["error"] for s, b in outcomes["t2"] if s == 402} <= {
        "budget_exhausted",
        "epsilon_above_remaining",
    }

    # tenant list: the collection's filters and their summary, not a collection cap
    rows = [json.loads(line) for line in _retriever("tenant", "list", "--ledger", ledger,
                                                    "--json").splitlines()]  # fmt: skip
    [filters_row] = [r for r in rows if r["status"] == "filters"]
    assert filters_row["documents"] == pytest.approx(summary)
    assert filters_row["epsilon_cap"] == DOCUMENT_EPSILON
    assert not [r for r in rows if r["status"] == "cap"]
    assert {r["accounting"] for r in rows} == {"individual"}
    text = _retriever("tenant", "list", "--ledger", ledger)
    assert f"{summary['exhausted']}/40 exhausted" in text and "(quota)" in text


def _doc_ids(world):
    return [
        json.loads(line)["doc_id"]
        for line in world["private_corpus"].read_text().splitlines()
        if line.strip()
    ]


def _serve(world, ledger, *extra):
    """`retriever serve` that is expected to refuse before it listens."""
    return cli(
        "serve", "--index", world["private_index"], "--private-corpus", world["private_corpus"],
        "--ledger", ledger, "--lm", "tiny", *extra, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--mechanism", "keywords", "--document-epsilon", "3", "--document-delta", "1e-5"),
         "icl only"),
        (("--document-delta", "1e-5"), "--document-epsilon"),
        (("--mechanism", "facts"), "icl only"),
    ],
)  # fmt: skip
def test_serve_refuses_what_individual_accounting_cannot_serve(world, tmp_path, extra, message):
    ledger = tmp_path / "ledger.sqlite"
    result = _serve(world, ledger, "--accounting", "individual", *extra)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()  # one line, no traceback
    assert message in line
    assert not ledger.exists()  # refused before the ledger was opened


def test_serve_refuses_a_collection_with_a_collection_cap(world, tmp_path):
    ledger = str(tmp_path / "ledger.sqlite")
    cli("tenant", "add", "alice", "--epsilon", 1, "--delta", 1e-5, "--ledger", ledger,
        "--dataset", "corpus", "--collection-epsilon", 5, "--collection-delta", 1e-5)  # fmt: skip
    result = _serve(world, ledger, "--accounting", "individual", "--document-epsilon", "3",
                    "--document-delta", "1e-5")  # fmt: skip
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert "has a collection cap" in line
    assert DocumentFilters(PrivacyLedger(ledger).store).get("corpus") is None
    # nor does a tenant of that collection become a quota
    added = cli("tenant", "add", "bob", "--epsilon", 1, "--delta", 1e-5, "--ledger", ledger,
                "--dataset", "corpus", "--accounting", "individual", check=False)  # fmt: skip
    assert added.returncode == 1 and "has a collection cap" in added.stderr
