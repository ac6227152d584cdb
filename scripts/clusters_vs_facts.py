"""The cluster release (DP-SynRAG) against the typed fact release, on the same fact worlds.

For each domain (`dpsynth.evaluation.fact_world`: people validation, products and species test;
`dpsynth.evaluation.natural_world`: helpdesk validation, facilities and lab test), both releases
at the same (epsilon, delta), each answering every question of the world:

* clusters: the cluster release at the defaults ``retriever knowledge release --mode
  clusters`` had (K = 6 keywords, L = 2 clusters per record, 64 clusters at most, M = 64
  voters at q = 1/2, free text), answered as ``retriever knowledge answer`` answers a
  cluster folder (`retriever.knowledge_base.KnowledgeBase`: the top record by BM25,
  SmolLM2-135M's greedy answer, an abstention when no record shares a word with the
  question);
* facts: `synthgen.knowledge.facts.release_facts` (typed facts, K = 1) answered by
  `retriever.typed_answers.TypedFactAnswerer` (no LM).

The cluster release was retired after this comparison (docs/guides/knowledge.md), so this
version does not build it: it answers the cluster folders that the script of commit 86c1f0b
(which built them with `build_knowledge` and `KnowledgeConfig(epsilon, delta)`) left under
``<out>/<domain>/clusters`` (a released folder stays answerable), with their release time
from ``<out>/<domain>/clusters_seconds.txt``; without one a domain's cluster row is not
measured. To build them again, run that commit's script.

Prints one line per (domain, release): accuracy on facts stated in >= 10 documents,
abstention on the unanswerable questions (a fact stated in one document, or a relation the
world never states), the share of answers that are wrong, and the release time; the last
line sums the domains up per release.

    python scripts/clusters_vs_facts.py --out runs/clusters_vs_facts --domains products,facilities
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from fact_worlds import answer_rows, make_fact_world

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

DELTA = 1e-6


def figures(rows: list[dict]) -> dict[str, float]:
    """accuracy (support >= 10), abstained (share of unanswerable questions abstained on:
    support 0 or 1), wrong (share of the answers given that are wrong); nan: no such row."""

    def mean(values) -> float:
        return float(np.mean(values)) if values else float("nan")

    return {
        "accuracy": mean([r["right"] for r in rows if r["support"] >= 10]),
        "abstained": mean([r["abstained"] for r in rows if r["support"] <= 1]),
        "wrong": mean([not r["right"] for r in rows if not r["abstained"]]),
    }


def cluster_rows(world, is_right, folder: Path, lm: str):
    """(rows, release seconds) of the cluster release an earlier run left in `folder`;
    (None, nan) when there is none."""
    from retriever.knowledge_base import KnowledgeBase

    release = folder / "clusters"
    if not (release / "card.json").is_file():
        return None, float("nan")
    timing = folder / "clusters_seconds.txt"
    seconds = float(timing.read_text()) if timing.is_file() else float("nan")
    base = KnowledgeBase.open(release, lm=lm, k=1, retrieval="bm25")  # the CLI's defaults
    return answer_rows(world, base.answer, is_right), seconds


def fact_rows(world, is_right, epsilon: float):
    """(rows, release seconds) of the typed fact release at `epsilon`."""
    from retriever.typed_answers import TypedFactAnswerer
    from synthgen.knowledge.facts import FactConfig, release_facts

    start = time.perf_counter()
    release = release_facts(list(world.documents), FactConfig(epsilon=epsilon, delta=DELTA))
    seconds = time.perf_counter() - start
    answerer = TypedFactAnswerer(release.records, noise_stddev=release.plan.noise_stddev)
    return answer_rows(world, answerer.answer, is_right), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/clusters_vs_facts"))
    parser.add_argument("--domains", default="products,facilities")
    parser.add_argument("--seed", type=int, default=7, help="the worlds' seed")
    parser.add_argument("--epsilon", type=float, default=10.0)
    parser.add_argument("--lm", default="smollm2-135m-instruct", help="the cluster folders' LM")
    args = parser.parse_args()
    everything: dict[str, list] = {"clusters": [], "facts": []}
    seconds_all: dict[str, list] = {"clusters": [], "facts": []}
    results = {}
    for domain in args.domains.split(","):
        world, is_right = make_fact_world(domain, args.seed)
        folder = args.out / domain
        folder.mkdir(parents=True, exist_ok=True)
        cells = {
            "clusters": cluster_rows(world, is_right, folder, args.lm),
            "facts": fact_rows(world, is_right, args.epsilon),
        }
        results[domain] = {}
        for name, (rows, seconds) in cells.items():
            if rows is None:
                print(f"{domain} {name}: not measured (no cluster folder under {folder}: "
                      "built by the script of commit 86c1f0b)")  # fmt: skip
                continue
            everything[name] += rows
            seconds_all[name].append(seconds)
            f = figures(rows)
            results[domain][name] = {**f, "seconds": seconds, "rows": rows}
            print(
                f"{domain} ({len(world.documents)} documents) {name} eps={args.epsilon:g}: "
                f"accuracy_support10={f['accuracy']:.2f} abstain_unanswerable="
                f"{f['abstained']:.2f} wrong_when_answered={f['wrong']:.2f} "
                f"release_seconds={seconds:.1f}",
                flush=True,
            )
    (args.out / "clusters_vs_facts.json").write_text(json.dumps(results, indent=1))
    parts = []
    for name, rows in everything.items():
        if rows:
            f = figures(rows)
            parts.append(
                f"{name}_support10={f['accuracy']:.2f} {name}_abstain={f['abstained']:.2f} "
                f"{name}_wrong={f['wrong']:.2f} {name}_seconds={sum(seconds_all[name]):.1f}"
            )
    print(" ".join(parts))


if __name__ == "__main__":
    main()
