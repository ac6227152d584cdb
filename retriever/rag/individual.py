"""Which documents an answer uses, and which pay, under individual (per-document) accounting.

In individual mode (`synthgen.privacy.individual`) a collection has no running privacy loss of
its own: each document has one, and pays only for the answers it can change. Retrieval uses
a *public* relevance threshold tau (MuRAG, Wu et al. 2025) instead of a DP one, so the
selection costs nothing, and an answer's payers are exactly the documents that are active
(their filter still admits this answer's charge) and score at least tau. The answer's rows
are the best `rows` payers (a fixed public shape, as in collection mode).

Why this charge is sound, document by document (add/remove one document i):

* i below tau, or i exhausted (excluded before the answer): i is in no row and displaces no
  row, so the answer's distribution is the same with and without i: loss 0.
* i a payer: removing i removes its row or, when the cap binds, lets the next payer's row in
  (a swap: the sensitivity 2C the token mechanism is calibrated for with ``capped=True``),
  so i's loss is at most the answer's token mechanism's. A payer beyond the cap changes
  nothing, but pays anyway: whether a document pays must depend on that document and the
  public question only (its own score and its own past charges), never on the other
  documents, or the filter's theorem (Feldman & Zrnic 2021) does not apply.

A document left out of an answer by its participation coin (`RagConfig.participation`, a
public probability; the coin is drawn for it alone, independently of the data) counts as
inactive for that answer: conditional on the coins the argument above holds, and the
mixture over coins keeps it.

`tests/retriever/rag/test_individual.py` checks each case by brute force on small worlds.
`answer_individually` is `DPRag.answer` in this mode: it picks the payers and charges them
with the tenant's quota in one transaction, then decodes at the usual fixed shape.
"""

from __future__ import annotations

import secrets
import time

import numpy as np

from retriever.rag.answer_types import Answer, AnswerFailedError
from retriever.rag.config import RagConfig
from retriever.rag.plan import AnswerPlan
from retriever.rag.retrieval import ScoreRange, best_selected
from synthgen.privacy import BudgetExceededError, secure_rng
from synthgen.privacy.receipts import CollectionPayer

UNIT_RANGE = ScoreRange()  # scores already in [0, 1]


def individual_rows(
    scores: np.typing.ArrayLike,
    tau: float,
    rows: int,
    active: np.typing.ArrayLike,
    score_range: ScoreRange = UNIT_RANGE,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of an individual-mode answer and the documents that pay for it (private).

    Args:
      scores: [N] similarity of the question to every document of the collection.
      tau: the public relevance threshold, on the normalised scale [0, 1] of `score_range`.
      rows: the public cap on rows (the answer's fixed shape).
      active: [N] bool, whether each document's filter admits this answer's charge
        (`synthgen.privacy.individual.DocumentBudget.fits`).
      score_range: the public clipping range of the scores.

    Returns:
      (indices [rows], weights [rows], payers [N]): the best `rows` payers, best first,
      padded with weight-0 entries; and the mask of the payers (active and normalised
      score >= tau), each charged the answer's per-document cost.

    Raises:
      ValueError: `active` does not have one entry per score, or tau is not in [0, 1].

    Privacy:
      Unit: one document, add/remove-one, in an individual filter. A document's payment
      depends only on its own score for the public question and on its own filter state;
      non-payers cannot change the answer (see the module docstring); a payer's effect is
      at most a row added, removed or swapped under the cap. Given the public tau, this
      selection releases nothing by itself (Wu et al. 2025, MuRAG; Feldman & Zrnic 2021).
    """
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau must be in [0, 1], got {tau=}")
    active = np.asarray(active, dtype=bool)
    if active.shape != np.shape(scores):
        raise ValueError(f"active must have one entry per score: {active.shape=}")
    # An exhausted document is in no row and pays nothing, whatever its score.
    return best_selected(scores, tau, rows, score_range, eligible=active)


def active_documents(rag, exhausted: list[str]) -> np.ndarray:
    """[N] whether each of `rag`'s documents is active (not in `exhausted`; private)."""
    active = np.ones(len(rag.doc_ids), dtype=bool)
    if exhausted:
        position = rag._position
        active[[position[d] for d in exhausted if d in position]] = False
    return active


def answer_individually(
    rag, question: str, tenant: str, plan: AnswerPlan, deadline: float | None
) -> Answer:
    """`rag`'s answer under per-document filters: the payers are chosen, and charged with
    the tenant's quota in one transaction, before any noise is drawn (`DPRag.answer` calls
    it for a config with individual accounting, holding the answer lock).

    Privacy:
      Individual Rényi filter (Feldman & Zrnic 2021): a document pays
      `plan.document_rho()` when it is active, its participation coin came up, and it
      scores at least the public relevance threshold
      (`individual_rows`), nothing otherwise; an exhausted
      document is excluded before the answer. The coins do not depend on the data:
      given any coins the filter's theorem holds, and a mixture over coins of
      (epsilon, delta)-DP interactions is (epsilon, delta)-DP (no amplification by
      the sampling is claimed). The tenant's scope composes
      the answer's (epsilon, delta) as a quota, not as the privacy statement, which is
      per document over all tenants. Known channels, not hidden by the fixed shape:
      the charge transaction reads the documents near their cap and writes two rows
      per payer, so its duration (not the decode's deadline, which starts after it)
      grows with those counts (about 0.1 ms per payer on SQLite); and a failure
      after the charge (charged, nothing released) is observable, though the fixed
      shape and padding of faulty rows make a data-dependent one unlikely.
    """
    rho = rag._document_rho(plan)
    ref = secrets.token_hex(16)
    stages = plan.stage_events()
    rag.check_budget(tenant, plan)  # the tenant's quota
    rng = rag._rng if rag._rng is not None else secure_rng()
    c = rag.config
    scores = rag._scores(question)
    # public coins, drawn for each document alone and independent of the data
    coins = rng.random(len(rag.doc_ids)) < c.participation
    chosen = []

    def payers(conn) -> tuple[list[str], float]:
        """Selected inside the charge's transaction: no other answer can exhaust a
        payer between this read and the charge."""
        active = active_documents(rag, rag.payer.exhausted_in(conn, rho)) & coins
        chosen.append(
            individual_rows(scores, c.relevance_threshold, c.voters, active, c.score_range)
        )
        return [rag.doc_ids[i] for i in np.flatnonzero(chosen[-1][2])], rho

    charge_started = time.monotonic()
    try:
        charges = rag._charge(tenant, plan.mechanism, stages, plan.delta, ref, documents=payers)
    except BudgetExceededError as refused:  # a concurrent answer, or a shared document
        raise BudgetExceededError(
            f"the charge of {tenant}'s answer was refused ({refused}); nothing was released"
        ) from None
    selection = chosen[-1]
    if deadline is not None:
        # the charge's time grows with the number of payers: the decode's wall-time
        # bound starts after it commits, so `truncated` and the token count do not
        # depend on how many documents were relevant
        deadline += time.monotonic() - charge_started
    failed = False
    try:
        released = rag._decode(question, plan, scores, selection, rng, deadline)
    except Exception:  # noqa: BLE001 - re-raised below without its private text
        failed = True
    if failed:
        raise AnswerFailedError(
            "the answer failed after its budget check; it was charged its worst case "
            "and released nothing"
        )
    return rag._assemble(tenant, plan, released, stages, charges, ref)


def check_individual(config: RagConfig, payer: CollectionPayer | None) -> None:
    """Individual accounting needs a payer whose collection is in individual mode and has
    no collection cap (a cap would compose every answer again and void the point)."""
    dataset = payer.dataset if payer is not None else None
    if not config.individual:
        if payer is not None and payer.document_filter() is not None:
            raise ValueError(
                f"collection {dataset!r} has per-document filters: answer it with "
                "individual accounting (its documents must pay for every answer)"
            )
        return
    if payer is None:
        raise ValueError("individual accounting needs a ledger (the per-document filters)")
    if payer.document_filter() is None:
        raise ValueError(
            f"collection {dataset!r} has no per-document filters: open them first "
            "(--document-epsilon, --document-delta)"
        )
    if payer.has_collection_cap():
        raise ValueError(
            f"collection {dataset!r} has a collection cap, which composes every answer; "
            "individual accounting replaces it with per-document filters: use another "
            "collection name"
        )
