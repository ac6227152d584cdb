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
