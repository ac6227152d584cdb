"""Seconds of a typed fact release on a large natural-text collection, on this machine.

Builds `--records` records from natural-text fact worlds (`dpsynth.evaluation.natural_world`,
helpdesk, facilities and lab, successive seeds; their subjects recur across seeds with other
values) and times `synthgen.knowledge.facts.release_facts` (typed facts, K = 1,
epsilon 10, delta 1e-6), extraction and selection apart, on PipelineDP's local backend or
(``--backend beam``) as one Apache Beam pipeline on the DirectRunner, extraction inside it.

    python scripts/bench_fact_release.py --records 100000 [--backend beam]

Last line: ``records=<n> backend=<b> extract_s=<s> release_s=<s> facts=<released>``.
"""

from __future__ import annotations

import argparse
import time

from dpsynth.evaluation.natural_world import DOMAINS, make_natural_world
from synthgen.knowledge.facts import FactConfig, release_facts
from synthgen.knowledge.typed_facts import record_fact_keys


def collection(records: int) -> list[str]:
    texts: list[str] = []
    seed = 0
    while len(texts) < records:
        for domain in DOMAINS:
            world = make_natural_world(domain, seed=seed)
            texts += world.documents
        seed += 1
    return texts[:records]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--backend", choices=("local", "beam"), default="local")
    args = parser.parse_args()
    texts = collection(args.records)
    start = time.perf_counter()
    for text in texts:
        record_fact_keys(text, 1)
    extract = time.perf_counter() - start
    start = time.perf_counter()
    release = release_facts(texts, FactConfig(epsilon=10.0, backend=args.backend))
    total = time.perf_counter() - start
    print(f"records={len(texts)} backend={args.backend} extract_s={extract:.1f} "
          f"release_s={total:.1f} facts={len(release.pairs)}")  # fmt: skip


if __name__ == "__main__":
    main()
