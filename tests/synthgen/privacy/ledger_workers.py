"""Ledger workers shared by the concurrency tests (a module of its own, not a test file, so
that spawned processes can import it)."""

from synthgen.privacy import accounting
from synthgen.privacy.errors import BudgetExceededError
from synthgen.privacy.ledger import PrivacyLedger

AR = "ADD_OR_REMOVE_ONE"


def charge_until_refused(
    location, barrier=None, results=None, *, query, epsilon, attempts=10, tenant="acme"
):
    """Charge `epsilon` (pure) to (`tenant`, `query`) `attempts` times; return how many fit.

    `barrier` (if given) lines the workers up before the first charge; `results` (a queue,
    if given) receives the count too, for `multiprocessing.Process` targets.
    """
    ledger = PrivacyLedger(location)
    event = accounting.pure_epsilon_event(epsilon)
    if barrier is not None:
        barrier.wait()  # all workers charge at the same moment
    accepted = 0
    for _ in range(attempts):
        try:
            ledger.charge(tenant, query, stage="p", relation=AR, event=event)
            accepted += 1
        except BudgetExceededError:
            pass
    if results is not None:
        results.put(accepted)
    return accepted


def race_processes(location, workers):
    """Runs each worker (a picklable `charge_until_refused` partial) in its own spawned
    process, all charging at one moment; returns how many charges each had accepted."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(len(workers)), ctx.Queue()
    processes = [ctx.Process(target=w, args=(location, barrier, results)) for w in workers]
    for p in processes:
        p.start()
    accepted = [results.get(timeout=300) for _ in processes]
    for p in processes:
        p.join(60)
        assert p.exitcode == 0
    return accepted
