"""One spend, one rounding: the service's /budget and `synthgen ledger show` state the same
figure for the same ledger, however long the service has been charging (issue 34)."""

import json
import re
import subprocess

import cli_process
from fastapi.testclient import TestClient

from dpsynth.service.app import Service, create_app
from dpsynth.service.tenants import TenantRegistry
from synthgen.privacy import PrivacyLedger, accounting, format_epsilon, format_remaining

RELATION = "ADD_OR_REMOVE_ONE"


def _synthgen(*args: str) -> subprocess.CompletedProcess:
    return cli_process.command("synthgen", *args, check=True)


def test_budget_and_ledger_show_print_the_same_figure(tmp_path):
    path = tmp_path / "ledger.sqlite"
    ledger = PrivacyLedger(path)
    registry = TenantRegistry(ledger)
    key = registry.add(
        "alice", "corpus", epsilon=10.0, delta=1e-6, collection_epsilon=20.0, collection_delta=1e-6
    )
    # The service's ledger object charges one event at a time: its running summary (the
    # charge checks' figure) coarsens its PLD grid along the way and states this history
    # 1e-4 below what a fresh process composes from the record (3.8357 vs 3.8358).
    for i in range(4):
        sampled = accounting.poisson_sampled(0.5, accounting.gaussian_event(1.5))
        event = accounting.gaussian_event(3.0) if i % 2 else sampled
        ledger.charge("alice", "corpus", stage="rag-answer", event=event, relation=RELATION)
    running = ledger.verify("alice", "corpus").stated  # what this object's checks use
    stated = ledger.spent("alice", "corpus").epsilon
    assert format_epsilon(running) != format_epsilon(stated)  # the two figures of issue 34

    with TestClient(create_app(Service(ledger, registry, "corpus", []))) as client:
        budget = client.get("/budget", headers={"Authorization": f"Bearer {key}"}).json()

    rows = json.loads(_synthgen("ledger", "show", "--db", str(path), "--json").stdout)
    [row] = [r for r in rows if r["tenant"] == "alice"]
    text = _synthgen("ledger", "show", "--db", str(path)).stdout
    [shown] = re.findall(r"^alice/corpus: epsilon (\S+) of 10 spent", text, flags=re.M)

    assert budget["spent_epsilon"] == row["epsilon_spent"]  # one function of the record
    assert budget["spent_epsilon_text"] == row["epsilon_spent_text"] == shown
    assert budget["spent_epsilon"] == stated == PrivacyLedger(path).spent("alice", "corpus").epsilon
    assert shown == format_epsilon(stated)
    assert budget["remaining_epsilon_text"] == row["epsilon_remaining_text"]
    assert budget["remaining_epsilon_text"] == format_remaining(10.0, budget["spent_epsilon"])
    # the shown spend is never below the stated one, and the two shown figures fit the cap
    assert float(shown) >= budget["spent_epsilon"]
    assert float(shown) + float(budget["remaining_epsilon_text"]) <= 10.0
    import datetime

    stamp = datetime.datetime.fromisoformat(budget["charges"][0]["created_at"])
    assert stamp.tzinfo is not None  # ISO 8601 with its offset, like every other time
