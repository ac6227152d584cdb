"""Answers from the network's fact releases: their records parsed, merged by phrase, answered.

A contributor's fact release (`synthgen.knowledge.facts`, `retriever.network.knowledge`)
serves one synthetic record per released key phrase with its partners by noisy count
(``"Dara Quill: Velmora Dynamics; 1970."``). The engine parses each contributor's hits back
into ``{topic, partners}`` (`parse_fact_record`), merges them by phrase over contributors
(`merge_fact_records`: partners united, best ranks first, and each record lends its topic
to its partners, since a released pair is one fact), and answers as one release does
(`retriever.fact_answers.FactAnswerer`). A contributor whose card has the ``fact-pairs``
stage (`is_fact_card`) is asked for ``EngineConfig.fact_k`` (20) records rather than k, as
a record must be among the hits to be read: on the fact worlds split over 3 contributors
(epsilon 10), the named phrase's record was in the top 10 for 170 of 172 (question,
contributor) pairs and in the top 20 for all; a release of thousands of records may need a
name match at the contributor instead.

Privacy:
  Reads only what the contributors released (their DP records, over ``/retrieve``) and the
  public LM: post-processing, nothing is charged anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

FACT_STAGE = "fact-pairs"  # the stage of a fact release on its card (`synthgen.knowledge.facts`)


def is_fact_card(card: Mapping[str, Any]) -> bool:
    """Whether a raw card (``/card``, `retriever.network.folder.make_card`) is a fact
    release's: its guarantee lists the ``fact-pairs`` stage."""
    guarantee = card.get("guarantee")
    stages = guarantee.get("stages") if isinstance(guarantee, Mapping) else None
    if not isinstance(stages, list):
        return False
    return any(isinstance(s, Mapping) and s.get("stage") == FACT_STAGE for s in stages)


def parse_fact_record(text: str) -> dict[str, Any] | None:
    """``{"topic", "partners", "text"}`` of a fact record's text, or None when `text` is not
    one (``"TOPIC: P1; P2; ...."``, as `synthgen.knowledge.facts.fact_records` writes it).

    A key phrase never holds ``:`` or ``;`` and never ends with ``.``
    (`synthgen.knowledge.phrases`), so the split is unambiguous.
    """
    if not isinstance(text, str) or not text.endswith(".") or ": " not in text:
        return None
    topic, rest = text[:-1].split(": ", 1)
    partners = rest.split("; ")
    if not topic.strip() or any(not p.strip() or ":" in p for p in partners):
        return None
    return {"topic": topic, "partners": partners, "text": text}


def merge_fact_records(per_contributor: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
    """One record per phrase from every contributor's hits (texts, best first).

    A phrase's partners: its own records' partners, rank by rank across contributors (the
    first partner of each contributor, then the second, ...), then the topics of records
    that list it as a partner (each released pair is one fact, stated from either side).

    Args:
      per_contributor: each contributor's hit texts (non-fact texts are skipped).

    Returns:
      ``{"topic", "partners", "text"}`` records in first-seen order (`FactAnswerer` input);
      ``text`` is the merged record, written as a fact release writes one.
    """
    parsed = [
        [r for r in map(parse_fact_record, texts) if r is not None] for texts in per_contributor
    ]
    own: dict[str, list[list[str]]] = {}
    lent: dict[str, list[str]] = {}
    for records in parsed:
        for record in records:
            own.setdefault(record["topic"], []).append(record["partners"])
            for partner in record["partners"]:
                lent.setdefault(partner, []).append(record["topic"])
    merged = []
    for topic in dict.fromkeys([*own, *lent]):
        lists = own.get(topic, [])
        ranked = [p for rank in range(max(map(len, lists), default=0)) for p in
                  (ps[rank] for ps in lists if rank < len(ps))]  # fmt: skip
        partners = [p for p in dict.fromkeys([*ranked, *lent.get(topic, [])]) if p != topic]
        if partners:
            merged.append(
                {"topic": topic, "partners": partners, "text": f"{topic}: {'; '.join(partners)}."}
            )
    return merged


def merge_typed_records(per_contributor: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
    """One typed record per subject from every contributor's typed hits: a value's count is
    the sum of its noisy counts at the contributors that released it (they hold disjoint
    records, so the sum estimates how many records of the network state it)."""
    from synthgen.knowledge.typed_facts import parse_typed_text

    counts: dict[str, dict[str, float]] = {}
    seen: set[tuple[int, str]] = set()
    for i, texts in enumerate(per_contributor):
        for record in filter(None, map(parse_typed_text, texts)):
            if (i, record["topic"]) in seen:  # the same record twice in one contributor's hits
                continue
            seen.add((i, record["topic"]))
            own = counts.setdefault(record["topic"], {})
            for fact in record["facts"]:
                own[fact["value"]] = own.get(fact["value"], 0.0) + fact["count"]
    from synthgen.knowledge.facts import fact_records
    from synthgen.knowledge.typed_facts import fact_key

    pairs = {fact_key(t, v): c for t, values in counts.items() for v, c in values.items()}
    return fact_records(pairs, max(map(len, counts.values()), default=1), "typed")


def fact_answer(
    lm: Any,
    question: str,
    per_contributor: Sequence[Sequence[str]],
    noise_stddev: float | None = None,
):
    """(answer, abstained, merged records read) for `question` over the contributors' hits.

    Typed releases (the default since issue 69) are merged by subject and answered by
    `retriever.typed_answers.TypedFactAnswerer`, with the noise of a sum over the
    contributors (sqrt(m) times the largest standard deviation their cards state); phrase
    releases as below.

    Args:
      lm: the public LM (`synthgen.lm_backends.NextTokenLM`) that picks among partners.
      question: the question.
      per_contributor: each fact-release contributor's hit texts.
      noise_stddev: the largest noise standard deviation of the contributors' cards (None:
        1.0).
    """
    from retriever.fact_answers import FactAnswerer

    typed = merge_typed_records(per_contributor)
    if typed:
        from retriever.typed_answers import TypedFactAnswerer

        sigma = (noise_stddev or 1.0) * len(per_contributor) ** 0.5
        found = TypedFactAnswerer(typed, sigma).answer(question)
        by_topic = {r["topic"]: r["text"] for r in typed}
        return found.answer, found.abstained, [by_topic[t] for t in found.records]
    records = merge_fact_records(per_contributor)
    found = FactAnswerer(records, lm).answer(question)
    by_topic = {r["topic"]: r["text"] for r in records}
    return found.answer, found.abstained, [by_topic[t] for t in found.records]
