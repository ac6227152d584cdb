"""Milliseconds per ledger charge as the history grows, and how tight the running spend is.

Charges one scope (``pld`` accountant, add/remove-one, delta cap 1e-5, a cap no history
reaches) `--charges` times with the 70-token DP-RAG answer event,
``self_composed(pure_epsilon_event(0.17517), 70)``, each charge timed end to end
(`PrivacyLedger.charge`: transaction, catch-up, check, insert, commit). Then the spend the
ledger states is compared with dp-accounting's exact PLD recomposition of every recorded
event (`PrivacyLedger.verify`; identical events, so one self-composition).

    python scripts/bench_ledger.py                      # SQLite in a temporary folder
    python scripts/bench_ledger.py --ledger postgresql://user@127.0.0.1:5432/db

Individual accounting (issue 35): a collection of `--documents` (100,000) documents in
individual mode, every document already charged once, then `--answers` (1,000) answers of 32
random documents each; an answer's store work is timed end to end, as an answer does it:
one transaction under the collection's lock that reads the exhausted documents
(`DocumentFilters.exhausted_in`) and charges the payers (`DocumentFilters.charge_in`: the
running loss and a charge row per document). Line:
``individual_charge_ms=<median per answer>`` (target <= 50 ms on SQLite).

Record bindings (issue 68): a collection of `--documents` records bound to a name
(`PrivacyLedger.bind_documents`: a keyed digest per record), bound again, then the same
records plus one under a new name (refused, then admitted with the flag), and the groups
listed, on a temporary SQLite ledger (whatever ``--ledger``). Line: ``bind_s=<first>
rebind_s=<again> refuse_s=<one record added, refused> admit_s=<admitted>
groups_s=<document_groups> ledger_mib=<file size>``; ``--bindings-only`` prints just that
line. The digests are computed before the bind lock is taken; under it, the lookups again
only if another collection was bound meanwhile, then the inserts.

Last line: ``charge_ms_first=<mean of the first 50> charge_ms_last=<mean of the last 50>
spent_vs_pld=<stated / recomposed>``. Targets (issue 17): last <= 3x first and <= 100 ms,
ratio in [1, 1.05].
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from synthgen.privacy import accounting
from synthgen.privacy.document_filters import DocumentFilter, DocumentFilters
from synthgen.privacy.individual import DocumentBudget
from synthgen.privacy.ledger import PrivacyLedger
from synthgen.privacy.ledger_types import Scope

ANSWER_EVENT = accounting.self_composed(accounting.pure_epsilon_event(0.17517), 70)
DOCUMENT_BUDGET = DocumentBudget(epsilon=10.0, delta=1e-6)


def individual_charge_ms(location, documents: int, answers: int, touched: int = 32) -> float:
    """Median milliseconds of one answer's per-document check and charge (see the module
    docstring), on a collection whose every document already has a loss row."""
    store = PrivacyLedger(location).store
    filters = DocumentFilters(store)
    answer_rho = DOCUMENT_BUDGET.rho_cap / (2 * answers)  # no document runs out here
    filters.open(DocumentFilter("bench-records", DOCUMENT_BUDGET, answer_rho, documents))
    ids = [f"record-{i:06d}" for i in range(documents)]
    for start in range(0, documents, 5000):
        filters.charge("bench-records", ids[start : start + 5000], answer_rho)
    rng = np.random.default_rng(0)
    times = []
    for _ in range(answers):
        chosen = [ids[i] for i in rng.choice(documents, touched, replace=False)]
        start = time.perf_counter()
        # as an answer does it: read the exhausted documents and charge the payers in one
        # transaction under the collection's lock (PrivacyLedger.charge_all(documents=...))
        with store.scope_lock("bench-records") as conn:
            exhausted = set(filters.exhausted_in(conn, "bench-records", answer_rho))
            payers = [d for d in chosen if d not in exhausted]
            filters.charge_in(conn, "bench-records", payers, answer_rho)
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def binding_seconds(location, documents: int) -> dict[str, float]:
    """Seconds of each binding step on `documents` records (see the module docstring)."""
    from synthgen.privacy.ledger_documents import SharedDocumentsError, bind_texts

    ledger = PrivacyLedger(location)
    rng = np.random.default_rng(0)
    words = np.array([f"w{i}" for i in range(5000)])
    picks = rng.integers(0, len(words), size=(documents, 30))
    texts = [f"ticket {i}: " + " ".join(words[row]) for i, row in enumerate(picks)]
    out = {}

    def timed(name, *args, **kwargs):
        start = time.perf_counter()
        try:
            bind_texts(ledger, *args, **kwargs)
        except SharedDocumentsError:
            pass
        out[name] = time.perf_counter() - start

    timed("bind_s", "bench-bound", texts)
    ledger.open_scope(Scope("bench", "bench-bound", 10.0, 1e-6, "pld"))
    ledger.charge("bench", "bench-bound", stage="s", event=ANSWER_EVENT,
                  relation="ADD_OR_REMOVE_ONE")  # fmt: skip
    timed("rebind_s", "bench-bound", texts)
    timed("refuse_s", "bench-bound-2", [*texts, "one more ticket"])
    timed("admit_s", "bench-bound-2", [*texts, "one more ticket"], guarantees_add_up=True)
    start = time.perf_counter()
    assert len(ledger.document_groups()) == 1
    out["groups_s"] = time.perf_counter() - start
    if ledger.path is not None:
        out["ledger_mib"] = Path(ledger.path).stat().st_size / 2**20
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=1000)
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument("--ledger", default=None, help="ledger URL (default: a temporary file)")
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--answers", type=int, default=1000)
    parser.add_argument("--bindings-only", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        location = args.ledger or Path(tmp) / "ledger.sqlite"
        # always a temporary SQLite file: the bench's names never land in a real ledger
        bindings = binding_seconds(Path(tmp) / "bind.sqlite", args.documents)
        print(" ".join(f"{k}={v:.2f}" for k, v in bindings.items()), flush=True)
        if args.bindings_only:
            return
        ledger = PrivacyLedger(location)
        ledger.open_scope(Scope("bench", "answers", 1e9, 1e-5, "pld"))
        times = []
        for i in range(args.charges):
            start = time.perf_counter()
            ledger.charge(
                "bench",
                "answers",
                stage="rag-answer",
                event=ANSWER_EVENT,
                relation="ADD_OR_REMOVE_ONE",
                description=f"answer {i}",
            )
            times.append(1000 * (time.perf_counter() - start))
            if (i + 1) % 100 == 0:
                print(f"charges={i + 1} charge_ms={times[-1]:.1f}", flush=True)
        start = time.perf_counter()
        check = ledger.verify("bench", "answers")
        print(
            f"stated_epsilon={check.stated:.4f} pld_recomposed={check.pld:.4f} "
            f"rdp_recomposed={check.rdp:.4f} recompose_s={time.perf_counter() - start:.1f}"
        )
        individual = individual_charge_ms(location, args.documents, args.answers)
        print(f"individual_charge_ms={individual:.2f}", flush=True)
    first = statistics.fmean(times[: args.window])
    last = statistics.fmean(times[-args.window :])
    ratio = check.stated / check.pld
    print(f"charge_ms_first={first:.2f} charge_ms_last={last:.2f} spent_vs_pld={ratio:.5f}")


if __name__ == "__main__":
    main()
