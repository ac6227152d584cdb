"""Facts of any collection: the fact release, single DP answers and non-private RAG, per domain.

For each fact world (`dpsynth.evaluation.fact_world`: people is the validation domain, products and
species the test domains; `dpsynth.evaluation.natural_world`, natural text: helpdesk validation,
facilities and lab test), at every support level (documents stating the fact):

* release: `synthgen.knowledge.facts` at epsilon 1, 3, 10 (delta 1e-6), answered by
  `retriever.fact_answers` (nothing charged per answer);
* single: one DP-RAG answer per question (`dpsynth.evaluation.single_fact_eval`, mechanism
  `auto`) at epsilon 5 and 10, for the supports in ``--single-supports``;
* rag: non-private RAG, BM25 top-4 documents and SmolLM2-135M's greedy answer;
* singleton leaks: a fact stated in one document whose value appears in a release;
* medical: the world and stream of `scripts/multi_query_eval.py` (its first 300 questions),
  fact releases at epsilon 10 with K = 1, 6 and 16 against non-private RAG.

Prints a table per domain, writes ``<out>/fact_eval.json`` and ``<out>/fact_eval.png``
(accuracy against support), and ends with the line
``release_eps10_support10=… release_eps10_support5=… release_eps3_support20=…
single_eps5_support20=… rag=… natural_eps10_support10=… abstain_unanswerable=…
wrong_when_answered=… singleton_leaks=…``, every figure over the test domains (support
>= 10, = 5, >= 20, = 20; rag: support >= 10; natural: the natural test domains at
epsilon 10, support >= 10); abstain_unanswerable is the share of questions whose answer is
in no release (a fact stated in one document, or a relation never stated) that the
epsilon-10 release abstains on, wrong_when_answered the share of its answers (to any
question) that are wrong; leaks over all domains and epsilons.

    python scripts/fact_world_eval.py --out runs/fact_eval
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from fact_worlds import answer_rows, make_fact_world

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

RELEASE_EPSILONS = (1.0, 3.0, 10.0)
SINGLE_EPSILONS = (5.0, 10.0)
DELTA = 1e-6
RAG_PROMPT_INSTRUCTION = "Use the documents to answer the question. Reply with the answer only."


def answerer(release, lm):
    """The answerer of a fact release: typed (`retriever.typed_answers`, no LM) or phrases
    (`retriever.fact_answers`, the public LM picks a partner)."""
    if release.plan.config.extractor == "typed":
        from retriever.typed_answers import TypedFactAnswerer

        return TypedFactAnswerer(release.records, release.plan.noise_stddev)
    from retriever.fact_answers import FactAnswerer

    return FactAnswerer(release.records, lm)


def _release_cells(world, lm, epsilons, answer_is_right, extractor) -> tuple[dict, int, dict]:
    from synthgen.knowledge.facts import FactConfig, release_facts

    cells, leaks, seconds = {}, 0, {}
    for eps in epsilons:
        start = time.perf_counter()
        config = FactConfig(epsilon=eps, delta=DELTA, extractor=extractor)
        release = release_facts(world.documents, config)
        seconds[eps] = time.perf_counter() - start
        released = "\n".join(release.pairs)
        rows = answer_rows(world, answerer(release, lm).answer, answer_is_right)
        for q in world.questions:
            if q.support == 1 and answer_is_right(released, q.answer):  # a secret out
                leaks += 1
        cells[eps] = {"rows": rows, "pairs": len(release.pairs), "records": len(release.records)}
    return cells, leaks, seconds


def _rag_rows(world, lm, answer_is_right) -> list[dict]:
    from dpsynth.evaluation.release_eval import retrieval_answerer
    from retriever.rag.prompts import PromptFormat

    prompt = PromptFormat(instruction=RAG_PROMPT_INSTRUCTION)
    texts = world.documents
    answer = retrieval_answerer(
        lm, prompt, texts, np.ones((len(texts), 1)), lambda q: np.ones((len(q), 1)),
        k=4, max_tokens=24, retrieval="bm25",
    )  # fmt: skip
    return [
        {"support": q.support, "right": answer_is_right(answer(q.question), q.answer)}
        for q in world.questions
    ]


def _single_rows(world, epsilons, supports, answer_is_right) -> dict:
    try:
        from dpsynth.evaluation.single_fact_eval import single_answers
    except ImportError:
        return {}

    asked = [q for q in world.questions if q.support in supports]
    out = {}
    for eps in epsilons:
        answers = single_answers(world.documents, [q.question for q in asked], eps, delta=DELTA)
        out[eps] = [
            {"support": q.support, "right": answer_is_right(a, q.answer), "answer": a}
            for q, a in zip(asked, answers, strict=True)
        ]
    return out


def medical_cells(lm, questions: int, max_pairs: tuple[int, ...], extractor: str) -> dict:
    """The medical world of `scripts/multi_query_eval.py` (2,000 records, 60 diseases), the
    first `questions` of its Zipf stream: fact releases at epsilon 10 (one per K) against
    non-private RAG (BM25 top-4, the medical prompt), each question text answered once."""
    from dpsynth.evaluation.medical_world import MedicalWorldConfig, answer_is_correct, make_world
    from dpsynth.evaluation.rag_eval import MEDICAL_PROMPT
    from dpsynth.evaluation.release_eval import retrieval_answerer
    from dpsynth.evaluation.stream_eval import zipf_stream
    from synthgen.knowledge.facts import FactConfig, release_facts

    world = make_world(MedicalWorldConfig(num_diseases=60, num_records=2000, symptom_pool=180))
    stream = zipf_stream(world, questions, seed=0)
    texts = [r.text for r in world.records]
    others = [d.name for d in world.diseases]
    answerers = {}
    for k in max_pairs:
        start = time.perf_counter()
        config = FactConfig(epsilon=10.0, delta=DELTA, max_pairs=k, extractor=extractor)
        release = release_facts(texts, config)
        seconds = time.perf_counter() - start
        answerers[f"release eps=10 K={k}"] = answerer(release, lm).answer
        print(f"medical K={k}: {len(release.pairs)} pairs released in {seconds:.1f} s")
    rag = retrieval_answerer(
        lm, MEDICAL_PROMPT, texts, np.ones((len(texts), 1)), lambda q: np.ones((len(q), 1)),
        k=4, max_tokens=8, retrieval="bm25",
    )  # fmt: skip
    cells = {}
    for name, answer in [*answerers.items(), ("non-private RAG", rag)]:
        cache: dict[str, bool] = {}
        for q in stream:
            if q.question not in cache:
                text = answer(q.question)
                text = text.answer if hasattr(text, "answer") else text
                cache[q.question] = answer_is_correct(text, q.answer, others=others)
        cells[name] = float(np.mean([cache[q.question] for q in stream]))
    return cells


def accuracy(rows, low: int, high: int | None = None) -> float:
    """Share right among rows with low <= support <= high (nan: none)."""
    high = low if high is None else high
    picked = [r["right"] for r in rows if low <= r["support"] <= high]
    return float(np.mean(picked)) if picked else float("nan")


def abstention(rows) -> tuple[float, float]:
    """(share of unanswerable questions abstained on, share of answers that are wrong):
    unanswerable means support 0 (a relation never stated) or 1 (a fact one document
    states, never released)."""
    unanswerable = [r["abstained"] for r in rows if r["support"] <= 1]
    answered = [not r["right"] for r in rows if not r["abstained"]]
    share = float(np.mean(unanswerable)) if unanswerable else float("nan")
    return share, float(np.mean(answered)) if answered else float("nan")


def _by_support(rows) -> dict[int, float]:
    levels = sorted({r["support"] for r in rows})
    return {s: accuracy(rows, s) for s in levels}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    domains = list(results["domains"])
    fig, axes = plt.subplots(1, len(domains), figsize=(4.2 * len(domains), 3.6), sharey=True)
    for ax, domain in zip(np.atleast_1d(axes), domains, strict=True):
        cell = results["domains"][domain]
        for eps, curve in cell["release"].items():
            ax.plot(list(map(int, curve)), list(curve.values()), "o-", label=f"release ε={eps}")
        for eps, curve in cell["single"].items():
            ax.plot(list(map(int, curve)), list(curve.values()), "s--", label=f"single ε={eps}")
        rag = cell["rag"]
        ax.plot(list(map(int, rag)), list(rag.values()), "k:", label="non-private RAG")
        ax.set_xscale("log")
        ax.set_xlabel("documents stating the fact")
        role = "validation" if domain in results["validation"] else "test"
        ax.set_title(f"{domain} ({role})")
        ax.set_ylim(-0.05, 1.05)
    np.atleast_1d(axes)[0].set_ylabel("questions answered right")
    np.atleast_1d(axes)[-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    from dpsynth.evaluation import natural_world
    from dpsynth.evaluation.fact_world import TEST_DOMAINS, VALIDATION_DOMAIN
    from retriever.network.local import load_answer_lm

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/fact_eval"))
    natural = (natural_world.VALIDATION_DOMAIN, *natural_world.TEST_DOMAINS)
    validation = {VALIDATION_DOMAIN, natural_world.VALIDATION_DOMAIN}
    parser.add_argument("--domains", default=",".join((VALIDATION_DOMAIN, *TEST_DOMAINS, *natural)))
    parser.add_argument("--seed", type=int, default=0, help="the worlds' seed")
    parser.add_argument("--facts-per-level", type=int, default=5)
    parser.add_argument("--single-supports", default="20", help="supports asked one by one")
    parser.add_argument("--no-single", action="store_true", help="skip the DP-RAG answers")
    parser.add_argument("--lm", default="smollm2-135m-instruct")
    parser.add_argument("--extractor", default="typed", help="the fact release's: typed or phrases")
    parser.add_argument(
        "--medical-questions", type=int, default=300, help="medical stream (0: skip)"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    lm, _ = load_answer_lm(args.lm)
    supports = {int(s) for s in args.single_supports.split(",") if s}
    results = {"validation": sorted(validation), "delta": DELTA, "domains": {}}
    everything = defaultdict(list)
    leaks = 0
    for domain in args.domains.split(","):
        world, is_right = make_fact_world(domain, args.seed, facts_per_level=args.facts_per_level)
        cells, domain_leaks, seconds = _release_cells(
            world, lm, RELEASE_EPSILONS, is_right, args.extractor
        )
        leaks += domain_leaks
        rag = _rag_rows(world, lm, is_right)
        single = {} if args.no_single else _single_rows(world, SINGLE_EPSILONS, supports, is_right)
        results["domains"][domain] = {
            "documents": len(world.documents),
            "release": {eps: _by_support(c["rows"]) for eps, c in cells.items()},
            "release_pairs": {eps: c["pairs"] for eps, c in cells.items()},
            "release_seconds": seconds,
            "single": {eps: _by_support(rows) for eps, rows in single.items()},
            "single_answers": single,
            "rag": _by_support(rag),
            "singleton_leaks": domain_leaks,
            "abstention": {eps: abstention(c["rows"]) for eps, c in cells.items()},
        }
        if domain in natural and domain not in validation:
            everything["natural10"] += cells[10.0]["rows"]
        if domain not in validation:
            everything["abstain10"] += cells[10.0]["rows"]
        if domain not in validation and domain not in natural:
            for eps, c in cells.items():
                everything[f"release{eps:g}"] += c["rows"]
            for eps, rows in single.items():
                everything[f"single{eps:g}"] += rows
            everything["rag"] += rag
        role = "validation" if domain in validation else "test"
        print(f"\n{domain} ({role}, {len(world.documents)} documents)")
        levels = sorted({q.support for q in world.questions if q.support > 0})
        print("| cell | " + " | ".join(f"support {s}" for s in levels) + " |")
        print("|---|" + "---|" * len(levels))
        rows = [(f"release ε={e:g}", c["rows"]) for e, c in cells.items()]
        rows += [(f"single ε={e:g}", r) for e, r in single.items()]
        rows += [("non-private RAG", rag)]
        for name, cell_rows in rows:
            by = _by_support(cell_rows)
            line = " | ".join("–" if s not in by else f"{by[s]:.2f}" for s in levels)
            print(f"| {name} | {line} |", flush=True)
        for eps, c in cells.items():
            share, wrong = abstention(c["rows"])
            print(f"release ε={eps:g}: abstains on {share:.2f} of unanswerable questions; "
                  f"{wrong:.2f} of its answers wrong ({c['pairs']} pairs)")  # fmt: skip
    results["singleton_leaks"] = leaks
    if args.medical_questions:
        medical = medical_cells(lm, args.medical_questions, (1, 6, 16), args.extractor)
        results["medical"] = medical
        print(f"\nmedical world, first {args.medical_questions} questions of the stream")
        for name, value in medical.items():
            ratio = value / max(medical["non-private RAG"], 1e-9)
            print(f"| {name} | {value:.3f} | {ratio:.2f}x non-private RAG |", flush=True)
    figures = {
        "release_eps10_support10": accuracy(everything["release10"], 10, 10**9),
        "release_eps10_support5": accuracy(everything["release10"], 5),
        "release_eps3_support20": accuracy(everything["release3"], 20, 10**9),
        "single_eps5_support20": accuracy(everything["single5"], 20),
        "rag": accuracy(everything["rag"], 10, 10**9),
        "natural_eps10_support10": accuracy(everything["natural10"], 10, 10**9),
    }
    figures["abstain_unanswerable"], figures["wrong_when_answered"] = abstention(
        everything["abstain10"]
    )
    results["figures"] = figures
    (args.out / "fact_eval.json").write_text(json.dumps(results, indent=1, default=str))
    plot(results, args.out / "fact_eval.png")
    print(" ".join(f"{k}={v:.2f}" for k, v in figures.items()) + f" singleton_leaks={leaks}")


if __name__ == "__main__":
    main()
