"""What a network query returns: merged hits and one report per contributor.

Privacy:
  A `NetworkResponse` holds the merged synthetic documents (post-processing of the
  contributors' DP releases), the DP answers of contributors in answer mode, and per
  contributor only public facts: its name and URL, its status and a one-line reason, how
  many hits it returned, how long it took, and what the request cost there. The question is
  not in it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

STATUSES = ("ok", "error", "timeout", "refused")


@dataclasses.dataclass(frozen=True)
class Hit:
    """One merged document, tagged with the contributor that returned it.

    Attributes:
      contributor: the contributor's name (`Contributor.label`).
      doc_id: its id at that contributor (ids of different contributors may coincide).
      text: the synthetic document.
      score: the merged score (the contributor's, or the re-ranker's).
      contributor_score: the score the contributor reported.
      contributor_rank: its rank at the contributor (0 = best).
    """

    contributor: str
    doc_id: str
    text: str
    score: float
    contributor_score: float
    contributor_rank: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ContributorReport:
    """What a response says about one contributor (nothing about the question).

    Attributes:
      name: `Contributor.label`.
      url: its base URL.
      status: "ok", "error", "timeout" or "refused".
      reason: one line: why it failed, or what it returned.
      hits: results it returned (0 unless ok).
      latency_s: seconds from the first attempt to the outcome.
      attempts: requests sent (retries included).
      http_status: the last HTTP status (None: no reply).
      epsilon: the privacy cost at the contributor as it reported it (0.0 for ``/retrieve``;
        the charged epsilon of an answer; None: no valid reply).
      guarantee: the release's guarantee from its card (`NetworkQueryEngine.fetch_cards`).
      served_answer: what its card says ``/answer`` costs (None: not served or no card).
    """

    name: str
    url: str
    status: str
    reason: str
    hits: int = 0
    latency_s: float = 0.0
    attempts: int = 0
    http_status: int | None = None
    epsilon: float | None = None
    guarantee: dict[str, Any] | None = None
    served_answer: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class NetworkResponse:
    """The merged result of one network query.

    Attributes:
      mode: "retrieve" (documents) or "answer" (each contributor's DP answer).
      k: documents asked for.
      contributors: one report per contributor, in the engine's order (never dropped).
      documents: the merged top-k hits, best first (retrieve mode).
      answer: the local LM's answer over the top documents (None: no local LM).
      answers: each answering contributor's DP answer (answer mode): ``{"contributor",
        "text", "epsilon", "delta", "mechanism", "remaining_epsilon"}``.
      reranked_by: the local encoder that re-scored the hits (None: contributors' scores).
      answered_by: the local LM's name.
      abstained: the local answer abstained (fact releases: the question names no released
        phrase; `retriever.network.facts`).
      records: the merged fact records the local answer read (fact releases only).
      elapsed_s: seconds for the whole query.
    """

    mode: str
    k: int
    contributors: list[ContributorReport]
    documents: list[Hit] = dataclasses.field(default_factory=list)
    answer: str | None = None
    answers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    reranked_by: str | None = None
    answered_by: str | None = None
    elapsed_s: float = 0.0
    abstained: bool = False
    records: list[str] = dataclasses.field(default_factory=list)

    @property
    def failed(self) -> list[ContributorReport]:
        """Contributors without a valid reply."""
        return [c for c in self.contributors if not c.ok]

    @property
    def all_failed(self) -> bool:
        return bool(self.contributors) and len(self.failed) == len(self.contributors)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the question is not in it)."""
        return {
            "mode": self.mode,
            "k": self.k,
            "contributors": [c.to_json() for c in self.contributors],
            "ok": sum(c.ok for c in self.contributors),
            "failed": len(self.failed),
            "documents": [h.to_json() for h in self.documents],
            "answer": self.answer,
            "answers": self.answers,
            "reranked_by": self.reranked_by,
            "answered_by": self.answered_by,
            "abstained": self.abstained,
            "records": self.records,
            "elapsed_s": self.elapsed_s,
        }
