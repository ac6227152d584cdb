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
"""

from __future__ import annotations

import numpy as np

from retriever.rag.retrieval import ScoreRange, best_selected

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
