"""Which documents an answer uses, and which pay, under individual (per-document) accounting.

Each document has its own filter (`synthgen.privacy.individual`) and pays only for the
answers it can change. Retrieval uses a *public* relevance threshold tau (MuRAG, Wu et al.
2025), so the selection costs nothing: the payers are the active documents (their filter
admits the charge and their participation coin, `RagConfig.participation`, came up) that
score at least tau; the rows are the best `rows` payers (a fixed public shape).

Why this charge is sound (add/remove one document i): i below tau or inactive is in no row
and displaces none (loss 0). Removing a payer removes its row or, when the cap binds, lets
the next payer's in (a swap: the sensitivity 2C of ``capped=True``), so its loss is at most
the token mechanism's. A payer beyond the cap changes nothing but pays anyway: whether a
document pays must depend on it and the public question only, never on the other
documents, or the filter's theorem (Feldman & Zrnic 2021) does not apply. The coins are
drawn for each document alone, independently of the data: given them the argument holds,
and the mixture over coins keeps it. `tests/retriever/rag/test_individual.py` checks each
case by brute force.
"""

from __future__ import annotations

import secrets
import time

import numpy as np

from retriever.rag.answer_types import Answer, after_charge
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
      active: [N] bool, whether each document takes part (its filter admits the charge).
      score_range: the public clipping range of the scores.

    Returns:
      (indices [rows], weights [rows], payers [N]): the best `rows` payers, best first,
      padded with weight-0 entries; and the mask of the payers (active and normalised
      score >= tau), each charged the answer's per-document cost.

    Raises:
      ValueError: `active` does not have one entry per score, or tau is not in [0, 1].

    Privacy:
      Unit: one document, add/remove-one, in an individual filter. Whether a document pays
      depends on its own score and filter state only; a non-payer cannot change the answer
      and a payer at most adds, removes or swaps one row (module docstring). Given the
      public tau, this selection releases nothing by itself (MuRAG; Feldman & Zrnic 2021).
    """
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau must be in [0, 1], got {tau=}")
    active = np.asarray(active, dtype=bool)
    if active.shape != np.shape(scores):
        raise ValueError(f"active must have one entry per score: {active.shape=}")
    # An exhausted document is in no row and pays nothing, whatever its score.
    return best_selected(scores, tau, rows, score_range, eligible=active)


def answer_individually(
    rag, question: str, tenant: str, plan: AnswerPlan, deadline: float | None
) -> Answer:
    """`rag`'s answer under per-document filters: the payers are chosen, and charged with
    the tenant's quota in one transaction, before any noise is drawn (`DPRag.answer` calls
    it for a config with individual accounting, holding the answer lock).

    Privacy:
      Individual Rényi filter (Feldman & Zrnic 2021): a document pays
      `plan.document_rho()` when it is a payer (`individual_rows`, module docstring),
      nothing otherwise; no amplification by the coins is claimed. The tenant's scope
      composes the answer's (epsilon, delta) as a quota, not as the privacy statement,
      which is per document over all tenants. Known channels, not hidden by the fixed
      shape: the charge transaction reads the documents near their cap and writes two rows
      per payer, so its duration (not the decode's deadline, which starts after it) grows
      with those counts (about 0.1 ms per payer on SQLite); and a failure after the charge
      (charged, nothing released) is observable, though the fixed shape and padding of
      faulty rows make a data-dependent one unlikely.
    """
    rho = rag._document_rho(plan)
    ref = secrets.token_hex(16)
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
        active = coins.copy()  # and not exhausted (private)
        exhausted = rag.payer.exhausted_in(conn, rho)
        active[[rag._position[d] for d in exhausted if d in rag._position]] = False
        chosen.append(
            individual_rows(scores, c.relevance_threshold, c.voters, active, c.score_range)
        )
        return [rag.doc_ids[i] for i in np.flatnonzero(chosen[-1][2])], rho

    charge_started = time.monotonic()
    try:
        charges = rag._charge(tenant, plan, ref, documents=payers)
    except BudgetExceededError as refused:  # a concurrent answer, or a shared document
        raise BudgetExceededError(
            f"the charge of {tenant}'s answer was refused ({refused}); nothing was released"
        ) from None
    if deadline is not None:  # starts after the charge, whose time grows with the payers
        deadline += time.monotonic() - charge_started
    selection = chosen[-1]
    released = after_charge(lambda: rag._decode(question, plan, scores, selection, rng, deadline))
    return rag._assemble(tenant, plan, released, charges, ref)


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
