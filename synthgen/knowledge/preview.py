"""See before you spend: what the fact release's public rule reads from a collection.

Operator-only, local and **not DP**: `preview_facts` runs a fact release's extractor over
the private records exactly as the release would (at most K facts per record), counts how
many records state each fact, and says how many of them a release at (epsilon, delta)
would carry. See docs/guides/knowledge.md ("See before you spend").

Privacy:
  Exact counts of the private records, printed to the operator's terminal, never released,
  charged or read by a release (which refuses on public figures only). Settings chosen by
  looking at it are chosen on private data, which the card's (epsilon, delta) does not
  cover (Liu & Talwar 2019; Papernot & Steinke 2022): preview a sample that is never
  released. Do not share the output.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from synthgen.knowledge.facts import FactConfig, plan_facts
from synthgen.knowledge.phrases import record_pairs, zipf
from synthgen.knowledge.typed_facts import record_fact_keys, split_fact, value_kind


@dataclasses.dataclass(frozen=True)
class FactPreview:
    """What the rule reads from a collection, and what a release would carry (not DP)."""

    records: int
    records_with_facts: int
    kinds: dict[str, int]  # facts read, by the kind of their value
    facts: list[tuple[str, int]]  # (fact key, records stating it), most stated first
    expected_released: float
    likely_released: int  # facts whose keep probability is at least one half
    records_needed: int  # for a fact to be released half the time (public)

    def to_dict(self, top: int = 30) -> dict:
        return {
            "not_dp": "exact counts of your private records: for your eyes only",
            "records": self.records,
            "records_with_facts": self.records_with_facts,
            "kinds": self.kinds,
            "distinct_facts": len(self.facts),
            "expected_released": self.expected_released,
            "likely_released": self.likely_released,
            "records_needed": self.records_needed,
            "top_facts": [{"fact": k, "records": n} for k, n in self.facts[:top]],
        }


def preview_facts(texts: Sequence[str], config: FactConfig) -> FactPreview:
    """Runs the release's extractor over `texts` and counts (module docstring: not DP).

    Raises:
      ValueError: no records.
    """
    if not texts:
        raise ValueError("the collection holds no record")
    extract = record_fact_keys if config.extractor == "typed" else record_pairs
    per_record = [extract(text, config.max_pairs) for text in texts]
    zipf.cache_clear()  # the rule's cache holds the records' words: not kept after reading
    counts = Counter(key for keys in per_record for key in dict.fromkeys(keys))
    kinds: Counter[str] = Counter()
    if config.extractor == "typed":
        kinds.update(value_kind(split_fact(key)[1]) for key in counts)
    plan = plan_facts(config, len(texts))
    keep = {n: plan.keep_probability(n) for n in set(counts.values())}
    return FactPreview(
        records=len(texts),
        records_with_facts=sum(bool(keys) for keys in per_record),
        kinds=dict(kinds.most_common()),
        facts=sorted(counts.items(), key=lambda kn: (-kn[1], kn[0])),
        expected_released=float(sum(keep[n] for n in counts.values())),
        likely_released=sum(keep[n] >= 0.5 for n in counts.values()),
        records_needed=plan.records_needed(0.5),
    )
